"""ONNX export: ``ember.onnx.export(model_or_fn, example_inputs, path)``.

The model runs once through ``ember.compile``'s capture (the registry funnel sees every op, so
there is no second tracing path): the captured ``Plan`` is a list of kernel calls, each a
registry op name with its attributes, plus the constants it reads (weights, folded values).
One table, ``EMITTERS``, maps each op name to a function that writes the ONNX nodes for it;
constants become initializers. An op without an entry raises ``UnsupportedOp`` naming it.

The protobuf is written in pure Python (the small writer of ``ember.onnx.testing``): export then
needs neither the ``onnx`` package nor numpy, and works in Pyodide, like ember's ONNX reader
(``ember.onnx.proto``). When the initializers pass 2 GB (protobuf's limit for one message),
every initializer of 1 KiB or more is written to ``<file>.data`` beside the model (ONNX's
external data: location, offset, length).

Dynamic axes: a plan is captured for one input shape, so its attributes hold sizes (a reshape's
target shape, a slice's end). With ``dynamic_axes`` the model is captured again with each named
axis one longer; every integer attribute that changed is rewritten as a linear function of the
axis sizes (``k * n + c``, or ``k * n * m + c`` for a product such as a flattened batch*length),
computed in the graph from the inputs' ``Shape``. Constants whose shape follows an axis
(``arange(n)``, ``full``) become ``Range`` / ``Expand``. A model whose ops change with the size
(Python ``if`` on a shape) cannot be exported with that axis dynamic: ``UnsupportedOp`` says so.

Quantized weights (``qlinear``/``qembedding``: ggml block formats) are written dequantized, as
float32 initializers: ggml's blocks (a scale *and* a minimum per 32 values, super-blocks for the
K-quants) are not the affine per-axis/per-block form of ONNX's ``DequantizeLinear``.

The KV cache of ``attention_cached`` (ember.nn.llama) is state: the exported graph is stateless,
reads the cache as it was at export (an initializer: rows before ``pos``) and does not return
the rows it would write.

>>> import ember, ember.onnx, tempfile, os
>>> f = lambda x: ember.relu(x * 2.0 - 1.0)
>>> path = os.path.join(tempfile.mkdtemp(), "f.onnx")
>>> info = ember.onnx.export(f, (ember.tensor([[0.0, 1.0]]),), path, dynamic_axes={"x": {0: "batch"}},
...                          input_names=["x"])
>>> ember.onnx.load(path)(ember.tensor([[1.0, 0.25], [0.0, 3.0]])).tolist()
[[1.0, 0.0], [0.0, 5.0]]
"""
from __future__ import annotations

import math
import os
import struct

from .. import dtypes as _dt
from ..errors import ShapeError, UnsupportedOp

OPSETS = range(17, 22)        # ai.onnx versions this exporter writes (IR version per opset below)
_IR = {17: 8, 18: 8, 19: 9, 20: 9, 21: 10}
EXTERNAL_LIMIT = 2 ** 31 - 2 ** 24   # initializer bytes above which tensors go to external data
EXTERNAL_MIN = 1024                  # smaller tensors stay inside the model file

# ember dtype name -> ONNX TensorProto.DataType
ONNX_TYPES = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
              "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13}


# ---- protobuf wire format: the writer of ember.onnx.testing ----------------------------------------

from .testing import _int, _len, _str, node as _node_proto, tensor_proto as _tensor_proto  # noqa: E402
from .testing import value_info as _value_info_proto  # noqa: E402


class _Init:
    __slots__ = ("name", "dtype", "shape", "raw")

    def __init__(self, name, dtype, shape, raw):
        self.name, self.dtype, self.shape, self.raw = name, dtype, tuple(shape), raw


# ---- sizes that follow the dynamic axes --------------------------------------------------------

class Dim:
    """An integer attribute that depends on dynamic axis sizes: ``c + sum(k_i * n_i)`` (``prod``
    False) or ``c + k * prod(n_i)`` (``prod`` True), with ``n_i`` named symbols."""

    __slots__ = ("syms", "ks", "c", "prod")

    def __init__(self, syms, ks, c, prod=False):
        self.syms, self.ks, self.c, self.prod = tuple(syms), tuple(ks), c, prod

    def value(self, sizes: dict) -> int:
        if self.prod:
            return self.c + self.ks[0] * math.prod(sizes[s] for s in self.syms)
        return self.c + sum(k * sizes[s] for k, s in zip(self.ks, self.syms))

    def key(self):
        return (self.syms, self.ks, self.c, self.prod)

    def __repr__(self):
        return f"Dim({self.syms}, {self.ks}, {self.c}, prod={self.prod})"


def _fit(base: int, sizes: dict, varied: list, extra) -> Dim | None:
    """The Dim through ``base`` (at ``sizes``) and the values seen with each symbol changed
    (``varied``: [(sym, new size, value)]), checked on ``extra`` (all changed) when given."""
    moved = [(s, n, v) for s, n, v in varied if v != base]
    if not moved:
        return None
    syms = tuple(s for s, _, _ in moved)
    ks = []
    for s, n, v in moved:
        d = n - sizes[s]
        if (v - base) % d:
            ks = None
            break
        ks.append((v - base) // d)
    cands = []
    if ks is not None:
        cands.append(Dim(syms, ks, base - sum(k * sizes[s] for k, s in zip(ks, syms))))
    p = math.prod(sizes[s] for s in syms)
    for s, n, v in moved[:1]:
        dp = p // sizes[s] * n - p
        if dp and (v - base) % dp == 0:
            k = (v - base) // dp
            cands.append(Dim(syms, (k,), base - k * p, prod=True))
    for c in cands:
        if all(c.value({**sizes, s: n}) == v for s, n, v in varied) and \
                (extra is None or c.value(extra[0]) == extra[1]):
            return c
    return None


# ---- graph building ----------------------------------------------------------------------------

class V:
    """A value of the graph being written: its ONNX name, shape (ints) and ember dtype."""

    __slots__ = ("name", "shape", "dtype")

    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype

    @property
    def ndim(self):
        return len(self.shape)


class Graph:
    """The nodes and initializers written so far, and helpers for emitters."""

    def __init__(self, opset: int):
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.n = 0
        self.dim_src: dict = {}      # symbol -> (input name, axis)
        self._cache: dict = {}
        self.op = ""                 # the registry op being emitted (for error messages)
        self.op_types: set = set()
        self.reserved: set = set()   # the graph's input and output names
        self.const_tensors: dict = {}   # initializer name -> the ember Tensor it holds

    def fresh(self, hint="t") -> str:
        while True:
            self.n += 1
            name = f"{hint}_{self.n}"
            if name not in self.reserved:
                return name

    def node(self, op_type, inputs, n_out=1, **attrs):
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.op_types.add(op_type)
        self.nodes.append(_node_proto(op_type, inputs, outs, f"{self.op}/{outs[0]}",
                                      **{k: v for k, v in attrs.items() if v is not None}))
        return outs[0] if n_out == 1 else outs

    def init(self, raw, dtype_name, shape, hint="const") -> str:
        key = (raw, dtype_name, tuple(shape)) if len(raw) <= 64 else None
        if key is not None and key in self._cache:
            return self._cache[key]
        name = self.fresh(hint)
        self.inits.append(_Init(name, dtype_name, shape, raw))
        if key is not None:
            self._cache[key] = name
        return name

    def scalar(self, value, dtype, shape=()) -> str:
        """A constant of ``dtype`` (an ember DType) holding ``value``."""
        dtype = _dt.get(dtype)
        if dtype.kind == "b":
            raw = struct.pack("<?", bool(value))
        else:
            raw = struct.pack("<" + dtype.fmt, int(value) if dtype.kind in "iu" else float(value))
        return self.init(raw * math.prod(shape), dtype.name, shape)

    def ints(self, values) -> str:
        """A 1-D int64 tensor of ``values`` (ints, or Dims computed from the input shapes)."""
        values = list(values)
        if all(isinstance(v, int) for v in values):
            return self.init(struct.pack(f"<{len(values)}q", *values), "int64", (len(values),), "ints")
        parts, run = [], []
        for v in values:
            if isinstance(v, Dim):
                if run:
                    parts.append(self.ints(run))
                    run = []
                parts.append(self.dim(v))
            else:
                run.append(int(v))
        if run:
            parts.append(self.ints(run))
        return parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)

    def dim(self, d: Dim) -> str:
        """A 1-D int64 tensor ``[d]`` computed from the graph inputs' shapes."""
        key = ("dim", d.key())
        if key in self._cache:
            return self._cache[key]
        terms = []
        for k, s in zip(d.ks if not d.prod else (1,) * len(d.syms), d.syms):
            src, axis = self.dim_src[s]
            n = self._cache.get(("sym", s))
            if n is None:
                n = self._cache[("sym", s)] = self.node("Shape", [src], start=axis, end=axis + 1)
            terms.append(n if k == 1 else self.node("Mul", [n, self.ints([k])]))
        out = terms[0]
        for t in terms[1:]:
            out = self.node("Mul" if d.prod else "Add", [out, t])
        if d.prod and d.ks[0] != 1:
            out = self.node("Mul", [out, self.ints([d.ks[0]])])
        if d.c:
            out = self.node("Add", [out, self.ints([d.c])])
        self._cache[key] = out
        return out

    def cast(self, v: V, dtype) -> str:
        return v.name if v.dtype is dtype else self.node("Cast", [v.name], to=ONNX_TYPES[dtype.name])

    def axes(self, op_type, x: str, axes, **attrs) -> str:
        """A reduction: ``axes`` as an input (ReduceSum from opset 13, all from 18) or attribute."""
        if op_type == "ReduceSum" or self.opset >= 18:
            return self.node(op_type, [x, self.ints(axes)], **attrs)
        return self.node(op_type, [x], axes=list(axes), **attrs)


def _static(g: Graph, v, what: str):
    """``v`` with no Dim inside, else UnsupportedOp: this attribute cannot follow a dynamic axis."""
    def walk(x):
        if isinstance(x, Dim):
            raise UnsupportedOp(f"onnx export: {g.op}: attribute {what} changes with a dynamic axis "
                                f"({x.syms}); export with that axis static")
        if isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
    walk(v)
    return v


# ---- the op table: registry op name -> emitter(g, attrs, outs, *inputs) -> output name(s) -------

EMITTERS: dict = {}


def emits(*names):
    def deco(fn):
        for n in names:
            EMITTERS[n] = fn
        return fn
    return deco


def _unary(onnx_op, float_in=True):
    def emit(g, a, outs, x):
        o = outs[0]
        src = g.cast(x, o.dtype) if float_in and o.dtype.kind == "f" else x.name
        return g.node(onnx_op, [src])
    return emit


for _name, _onnx in {"abs": "Abs", "ceil": "Ceil", "cos": "Cos", "erf": "Erf", "exp": "Exp", "floor": "Floor",
                     "log": "Log", "negative": "Neg", "round": "Round", "sign": "Sign", "sin": "Sin",
                     "sqrt": "Sqrt", "tanh": "Tanh", "acos": "Acos", "acosh": "Acosh", "asin": "Asin",
                     "asinh": "Asinh", "atan": "Atan", "atanh": "Atanh", "cosh": "Cosh", "sinh": "Sinh",
                     "tan": "Tan", "relu": "Relu", "sigmoid": "Sigmoid"}.items():
    EMITTERS[_name] = _unary(_onnx)


@emits("isnan")
def _isnan(g, a, outs, x):
    return g.node("IsNaN", [x.name]) if x.dtype.kind == "f" else g.scalar(False, _dt.bool_, x.shape)


@emits("logical_not")
def _not(g, a, outs, x):
    return g.node("Not", [g.cast(x, _dt.bool_)])


def _binary(onnx_op, to="out"):
    def emit(g, a, outs, x, y):
        dt = outs[0].dtype if to == "out" else _dt.result_type(x.dtype, y.dtype)
        return g.node(onnx_op, [g.cast(x, dt), g.cast(y, dt)])
    return emit


for _name, _onnx in {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "pow": "Pow",
                     "maximum": "Max", "minimum": "Min", "matmul": "MatMul"}.items():
    EMITTERS[_name] = _binary(_onnx)
for _name, _onnx in {"equal": "Equal", "less": "Less", "less_equal": "LessOrEqual", "greater": "Greater",
                     "greater_equal": "GreaterOrEqual"}.items():
    EMITTERS[_name] = _binary(_onnx, to="promote")


@emits("logical_and", "logical_or", "logical_xor")
def _logical(g, a, outs, x, y):
    op = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor"}[g.op]
    return g.node(op, [g.cast(x, _dt.bool_), g.cast(y, _dt.bool_)])


@emits("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_invert")
def _bitwise(g, a, outs, x, y=None):
    dt = outs[0].dtype
    ins = [g.cast(v, dt) for v in (x, y) if v is not None]
    if dt.kind == "b":
        return g.node({"bitwise_and": "And", "bitwise_or": "Or", "bitwise_xor": "Xor", "bitwise_invert": "Not"}[g.op], ins)
    if g.opset < 18:
        raise UnsupportedOp(f"onnx export: {g.op} on {dt.name} needs opset 18 or later (exporting opset {g.opset})")
    return g.node({"bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr", "bitwise_xor": "BitwiseXor",
                   "bitwise_invert": "BitwiseNot"}[g.op], ins)


@emits("bitwise_left_shift", "bitwise_right_shift")
def _shift(g, a, outs, x, y):
    # ONNX's BitShift takes unsigned types only: x * 2**y, and floor(x / 2**y) for signed ones
    dt = outs[0].dtype
    xs = g.cast(x, dt)
    p = g.node("Pow", [g.scalar(2, dt), g.cast(y, dt)])
    if g.op == "bitwise_left_shift":
        return g.node("Mul", [xs, p])
    return g.node("Div", [g.node("Sub", [xs, g.node("Mod", [xs, p], fmod=0)]), p])


@emits("not_equal")
def _ne(g, a, outs, x, y):
    dt = _dt.result_type(x.dtype, y.dtype)
    return g.node("Not", [g.node("Equal", [g.cast(x, dt), g.cast(y, dt)])])


@emits("floor_divide")
def _floordiv(g, a, outs, x, y):
    dt = outs[0].dtype
    xs, ys = g.cast(x, dt), g.cast(y, dt)
    if dt.kind == "f":
        return g.node("Floor", [g.node("Div", [xs, ys])])
    return g.node("Div", [g.node("Sub", [xs, g.node("Mod", [xs, ys], fmod=0)]), ys])   # exact division


@emits("remainder")
def _remainder(g, a, outs, x, y):
    dt = outs[0].dtype
    xs, ys = g.cast(x, dt), g.cast(y, dt)
    if dt.kind != "f":
        return g.node("Mod", [xs, ys], fmod=0)
    r = g.node("Mod", [xs, ys], fmod=1)             # C fmod; Python's result takes the divisor's sign
    zero = g.scalar(0.0, dt)
    fix = g.node("And", [g.node("Not", [g.node("Equal", [r, zero])]),
                         g.node("Xor", [g.node("Less", [r, zero]), g.node("Less", [ys, zero])])])
    return g.node("Where", [fix, g.node("Add", [r, ys]), r])


@emits("where")
def _where(g, a, outs, c, x, y):
    dt = outs[0].dtype
    return g.node("Where", [g.cast(c, _dt.bool_), g.cast(x, dt), g.cast(y, dt)])


@emits("cast")
def _cast(g, a, outs, x):
    return g.node("Cast", [x.name], to=ONNX_TYPES[outs[0].dtype.name])


@emits("clip")
def _clip(g, a, outs, x):
    dt = outs[0].dtype
    lo, hi = a.get("min"), a.get("max")
    return g.node("Clip", [g.cast(x, dt), "" if lo is None else g.scalar(lo, dt),
                           "" if hi is None else g.scalar(hi, dt)])


def _reduce(onnx_op):
    def emit(g, a, outs, x):
        src = g.cast(x, outs[0].dtype)
        axes = list(a["axes"])
        if not axes:
            return g.node("Identity", [src])
        return g.axes(onnx_op, src, axes, keepdims=int(a["keepdims"]))
    return emit


EMITTERS.update(sum=_reduce("ReduceSum"), prod=_reduce("ReduceProd"), max=_reduce("ReduceMax"),
                min=_reduce("ReduceMin"))


@emits("argmax", "argmin")
def _argmax(g, a, outs, x):
    r = g.node("ArgMax" if g.op == "argmax" else "ArgMin", [x.name], axis=a["axis"], keepdims=int(a["keepdims"]))
    return g.cast(V(r, (), _dt.int64), outs[0].dtype)


@emits("reshape")
def _reshape(g, a, outs, x):
    return g.node("Reshape", [x.name, g.ints(a["shape"])])


@emits("permute_dims")
def _permute(g, a, outs, x):
    return g.node("Transpose", [x.name], perm=list(_static(g, a["axes"], "axes")))


@emits("broadcast_to")
def _broadcast(g, a, outs, x):
    return g.node("Expand", [x.name, g.ints(a["shape"])])


@emits("slice")
def _slice(g, a, outs, x):
    starts, ends, axes, steps = [], [], [], []
    for ax, ((start, stop, step), n) in enumerate(zip(a["slices"], x.shape)):
        if (start, stop, step) == (0, n, 1) and not isinstance(n, Dim):
            continue
        if isinstance(stop, int) and step < 0 and stop < 0:
            stop = -(2 ** 63)        # slice.indices' "before index 0"; ONNX reads -1 as the last index
        starts.append(start)
        ends.append(stop)
        axes.append(ax)
        steps.append(_static(g, step, "slices"))
    if not axes:
        return g.node("Identity", [x.name])
    return g.node("Slice", [x.name, g.ints(starts), g.ints(ends), g.ints(axes), g.ints(steps)])


@emits("concat")
def _concat(g, a, outs, *xs):
    return g.node("Concat", [g.cast(x, outs[0].dtype) for x in xs], axis=a["axis"])


@emits("take")
def _take(g, a, outs, x, idx):
    return g.node("Gather", [x.name, idx.name], axis=a["axis"])


@emits("take_along_axis")
def _take_along(g, a, outs, x, idx):
    ax, shape = a["axis"], list(outs[0].shape)
    xshape = list(shape)
    xshape[ax] = x.shape[ax]
    xs = x.name if list(x.shape) == xshape else g.node("Expand", [x.name, g.ints(xshape)])
    ids = idx.name if list(idx.shape) == shape else g.node("Expand", [idx.name, g.ints(shape)])
    return g.node("GatherElements", [xs, ids], axis=ax)


@emits("full")
def _full(g, a, outs):
    o = outs[0]
    return g.node("Expand", [g.scalar(a["value"], o.dtype), g.ints(a["shape"])])


@emits("arange")
def _arange(g, a, outs):
    o = outs[0]
    num = a["num"]
    i = g.node("Range", [g.scalar(0, _dt.int64), g.node("Squeeze", [g.ints([num]), g.ints([0])]),
                         g.scalar(1, _dt.int64)])
    v = g.node("Cast", [i], to=ONNX_TYPES[o.dtype.name])
    return g.node("Add", [g.node("Mul", [v, g.scalar(a["step"], o.dtype)]), g.scalar(a["start"], o.dtype)])


@emits("cumsum")
def _cumsum(g, a, outs, x):
    return g.node("CumSum", [g.cast(x, outs[0].dtype), g.scalar(a["axis"], _dt.int64)],
                  exclusive=int(a["exclusive"]), reverse=int(a["reverse"]))


@emits("sort")
def _sort(g, a, outs, x):
    ax = a["axis"]
    vals, idx = g.node("TopK", [x.name, g.ints([x.shape[ax]])], n_out=2, axis=ax,
                       largest=int(a["descending"]), sorted=1)
    return vals, g.cast(V(idx, (), _dt.int64), outs[1].dtype)


@emits("pad")
def _pad(g, a, outs, x):
    pw = a["pad_width"]
    mode = a["mode"]
    if mode == "wrap" and g.opset < 19:
        raise UnsupportedOp(f"onnx export: pad mode 'wrap' needs opset 19 or later (exporting opset {g.opset})")
    pads = g.ints([p[0] for p in pw] + [p[1] for p in pw])
    ins = [x.name, pads] + ([g.scalar(a.get("value") or 0, x.dtype)] if mode == "constant" else [])
    return g.node("Pad", ins, mode=mode)


# ---- neural-network ops ----------------------------------------------------------------------------

def _pads(padding):
    (t, b), (l, r) = padding
    return [t, l, b, r]


@emits("conv2d")
def _conv(g, a, outs, x, w, b=None):
    return g.node("Conv", [x.name, w.name] + ([b.name] if b is not None else []), strides=list(a["stride"]),
                  pads=_pads(a["padding"]), dilations=list(a["dilation"]), group=a["groups"])


@emits("conv_transpose2d")
def _conv_t(g, a, outs, x, w, b=None):
    return g.node("ConvTranspose", [x.name, w.name] + ([b.name] if b is not None else []),
                  strides=list(a["stride"]), pads=_pads(a["padding"]), dilations=list(a["dilation"]),
                  group=a["groups"], output_padding=list(a["output_padding"]))


@emits("max_pool2d")
def _maxpool(g, a, outs, x):
    return g.node("MaxPool", [x.name], kernel_shape=list(a["kernel_size"]), strides=list(a["stride"]),
                  pads=_pads(a["padding"]), dilations=list(a["dilation"]), ceil_mode=int(a["ceil_mode"]))


@emits("avg_pool2d")
def _avgpool(g, a, outs, x):
    return g.node("AveragePool", [x.name], kernel_shape=list(a["kernel_size"]), strides=list(a["stride"]),
                  pads=_pads(a["padding"]), ceil_mode=int(a["ceil_mode"]),
                  count_include_pad=int(a["count_include_pad"]))


@emits("batch_norm")
def _batchnorm(g, a, outs, x, mean, var, w, b):
    return g.node("BatchNormalization", [x.name, w.name, b.name, mean.name, var.name], epsilon=float(a["eps"]))


@emits("layer_norm")
def _layernorm(g, a, outs, x, w, b):
    return g.node("LayerNormalization", [x.name, w.name, b.name], axis=-len(a["normalized_shape"]),
                  epsilon=float(a["eps"]))


@emits("linear")
def _linear(g, a, outs, x, w, b=None):
    if x.ndim == 2:
        return g.node("Gemm", [x.name, w.name] + ([b.name] if b is not None else []), transB=1)
    y = g.node("MatMul", [x.name, g.node("Transpose", [w.name], perm=[1, 0])])
    return y if b is None else g.node("Add", [y, b.name])


@emits("leaky_relu")
def _leaky(g, a, outs, x):
    return g.node("LeakyRelu", [x.name], alpha=float(a["negative_slope"]))


@emits("silu")
def _silu(g, a, outs, x):
    return g.node("Mul", [x.name, g.node("Sigmoid", [x.name])])


@emits("gelu")
def _gelu(g, a, outs, x):
    dt, half = x.dtype, g.scalar(0.5, x.dtype)
    if a["approximate"] == "tanh":
        x3 = g.node("Mul", [g.node("Mul", [x.name, x.name]), x.name])
        inner = g.node("Mul", [g.node("Add", [x.name, g.node("Mul", [x3, g.scalar(0.044715, dt)])]),
                               g.scalar(math.sqrt(2.0 / math.pi), dt)])
        t = g.node("Tanh", [inner])
    else:
        t = g.node("Erf", [g.node("Mul", [x.name, g.scalar(math.sqrt(0.5), dt)])])
    return g.node("Mul", [g.node("Mul", [x.name, half]), g.node("Add", [t, g.scalar(1.0, dt)])])


@emits("softmax", "log_softmax")
def _softmax(g, a, outs, x):
    return g.node("Softmax" if g.op == "softmax" else "LogSoftmax", [x.name], axis=a["axis"])


@emits("expm1")
def _expm1(g, a, outs, x):
    return g.node("Sub", [g.node("Exp", [x.name]), g.scalar(1.0, x.dtype)])


@emits("log1p")
def _log1p(g, a, outs, x):
    return g.node("Log", [g.node("Add", [x.name, g.scalar(1.0, x.dtype)])])


@emits("log2", "log10")
def _logb(g, a, outs, x):
    return g.node("Div", [g.node("Log", [x.name]), g.scalar(math.log(2.0 if g.op == "log2" else 10.0), x.dtype)])


@emits("trunc")
def _trunc(g, a, outs, x):
    neg = g.node("Less", [x.name, g.scalar(0.0, x.dtype)])
    return g.node("Where", [neg, g.node("Ceil", [x.name]), g.node("Floor", [x.name])])


@emits("hypot")
def _hypot(g, a, outs, x, y):
    return g.node("Sqrt", [g.node("Add", [g.node("Mul", [x.name, x.name]), g.node("Mul", [y.name, y.name])])])


def _signbit_of(g, x: V) -> str:
    zero = g.scalar(0.0, x.dtype)
    neg_zero = g.node("And", [g.node("Equal", [x.name, zero]),
                              g.node("Less", [g.node("Reciprocal", [x.name]), zero])])   # 1/-0 = -inf
    return g.node("Or", [g.node("Less", [x.name, zero]), neg_zero])


@emits("signbit")
def _signbit(g, a, outs, x):
    return _signbit_of(g, x)


@emits("copysign")
def _copysign(g, a, outs, x, y):
    m = g.node("Abs", [x.name])
    return g.node("Where", [_signbit_of(g, y), g.node("Neg", [m]), m])


@emits("logaddexp")
def _logaddexp(g, a, outs, x, y):
    m = g.node("Max", [x.name, y.name])
    s = g.node("Add", [g.node("Exp", [g.node("Sub", [x.name, m])]), g.node("Exp", [g.node("Sub", [y.name, m])])])
    return g.node("Add", [m, g.node("Log", [s])])


@emits("atan2")
def _atan2(g, a, outs, y, x):
    dt = x.dtype
    zero = g.scalar(0.0, dt)
    r = g.node("Atan", [g.node("Div", [y.name, x.name])])
    turn = g.node("Where", [g.node("GreaterOrEqual", [y.name, zero]), g.scalar(math.pi, dt), g.scalar(-math.pi, dt)])
    r = g.node("Where", [g.node("Less", [x.name, zero]), g.node("Add", [r, turn]), r])
    both0 = g.node("And", [g.node("Equal", [x.name, zero]), g.node("Equal", [y.name, zero])])
    return g.node("Where", [both0, zero, r])


@emits("linalg_det")
def _det(g, a, outs, x):
    return g.node("Det", [x.name])


def _attention(g, q, kt, v, mask_bool, mask_add, scale, dt):
    """softmax(q @ kt * scale, masked) @ v, a row whose keys are all masked giving zeros (ember's rule)."""
    s = g.node("Mul", [g.node("MatMul", [q, kt]), g.scalar(scale, dt)])
    if mask_bool is not None:
        s = g.node("Where", [mask_bool, s, g.scalar(-math.inf, dt)])
    if mask_add is not None:
        s = g.node("Add", [s, mask_add])
    m = g.axes("ReduceMax", s, [-1], keepdims=1)
    dead = g.node("Equal", [m, g.scalar(-math.inf, dt)])
    e = g.node("Exp", [g.node("Sub", [s, g.node("Where", [dead, g.scalar(0.0, dt), m])])])
    z = g.node("Where", [dead, g.scalar(1.0, dt), g.axes("ReduceSum", e, [-1], keepdims=1)])
    return g.node("MatMul", [g.node("Div", [e, z]), v])


@emits("scaled_dot_product_attention")
def _sdpa(g, a, outs, q, k, v, mask=None):
    nd = k.ndim
    kt = g.node("Transpose", [k.name], perm=list(range(nd - 2)) + [nd - 1, nd - 2])
    mb = ma = None
    if a["is_causal"]:
        L, S = q.shape[-2], k.shape[-2]
        ones = g.node("Expand", [g.scalar(1, _dt.int64), g.ints([L, S])])
        mb = g.node("Cast", [g.node("Trilu", [ones], upper=0)], to=ONNX_TYPES["bool"])
    if mask is not None:
        if mask.dtype is _dt.bool_:
            mb = mask.name if mb is None else g.node("And", [mb, mask.name])
        else:
            ma = mask.name
    return _attention(g, q.name, kt, v.name, mb, ma, float(a["scale"]), outs[0].dtype)


@emits("rms_norm")
def _rms(g, a, outs, x, w):
    ms = g.axes("ReduceMean", g.node("Mul", [x.name, x.name]), [-1], keepdims=1)
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [ms, g.scalar(float(a["eps"]), x.dtype)])])])
    return g.node("Mul", [g.node("Mul", [x.name, inv]), w.name])


@emits("rope")
def _rope(g, a, outs, x, cos, sin):
    c = g.node("Unsqueeze", [cos.name, g.ints([1])])     # (T, 1, D/2)
    s = g.node("Unsqueeze", [sin.name, g.ints([1])])
    half = x.shape[-1] // 2
    if a["mode"] == "pairs":
        p = g.node("Reshape", [x.name, g.ints([0, 0, half, 2])])
        x0 = g.node("Squeeze", [g.node("Slice", [p, g.ints([0]), g.ints([1]), g.ints([3])]), g.ints([3])])
        x1 = g.node("Squeeze", [g.node("Slice", [p, g.ints([1]), g.ints([2]), g.ints([3])]), g.ints([3])])
    else:
        x0 = g.node("Slice", [x.name, g.ints([0]), g.ints([half]), g.ints([2])])
        x1 = g.node("Slice", [x.name, g.ints([half]), g.ints([2 * half]), g.ints([2])])
    r0 = g.node("Sub", [g.node("Mul", [x0, c]), g.node("Mul", [x1, s])])
    r1 = g.node("Add", [g.node("Mul", [x0, s]), g.node("Mul", [x1, c])])
    if a["mode"] == "pairs":
        r = g.node("Concat", [g.node("Unsqueeze", [r0, g.ints([3])]), g.node("Unsqueeze", [r1, g.ints([3])])], axis=3)
        return g.node("Reshape", [r, g.ints([0, 0, 2 * half])])
    return g.node("Concat", [r0, r1], axis=2)


@emits("attention_cached")
def _attn_cached(g, a, outs, q, k, v, kc, vc, pos):
    # Stateless: cache rows 0..pos-1 as they were at export, then the T new rows; causal.
    if a.get("window") or a.get("softcap"):
        raise UnsupportedOp("onnx export: attention_cached with a sliding window or soft-capped scores "
                            "(Gemma) is not exported")
    T, hq, d = q.shape
    hkv = k.shape[1]
    p64 = g.node("Cast", [pos.name], to=ONNX_TYPES["int64"])                       # (1,)
    keys = g.node("Concat", [g.node("Slice", [kc.name, g.ints([0]), p64, g.ints([0])]), k.name], axis=0)
    vals = g.node("Concat", [g.node("Slice", [vc.name, g.ints([0]), p64, g.ints([0])]), v.name], axis=0)
    grp = hq // hkv
    qh = g.node("Transpose", [g.node("Reshape", [q.name, g.ints([0, hkv, grp, d])])], perm=[1, 2, 0, 3])  # (Hkv,G,T,d)
    kt = g.node("Unsqueeze", [g.node("Transpose", [keys], perm=[1, 2, 0]), g.ints([1])])           # (Hkv,1,d,S)
    vh = g.node("Unsqueeze", [g.node("Transpose", [vals], perm=[1, 0, 2]), g.ints([1])])           # (Hkv,1,S,d)
    # key j is seen by query t when j <= pos + t
    zero, one = g.scalar(0, _dt.int64), g.scalar(1, _dt.int64)
    n_keys = g.node("Squeeze", [g.node("Shape", [keys], start=0, end=1), g.ints([0])])
    n_new = g.node("Squeeze", [g.node("Shape", [q.name], start=0, end=1), g.ints([0])])
    j = g.node("Range", [zero, n_keys, one])
    t = g.node("Add", [g.node("Range", [zero, n_new, one]), p64])
    mask = g.node("LessOrEqual", [g.node("Unsqueeze", [j, g.ints([0])]), g.node("Unsqueeze", [t, g.ints([1])])])
    o = _attention(g, qh, kt, vh, mask, None, float(a["scale"]), _dt.float32)                    # (Hkv,G,T,d)
    return g.node("Reshape", [g.node("Transpose", [o], perm=[2, 0, 1, 3]), g.ints([0, hq, d])])


def _dequantized(g, w: V, a) -> str:
    t = g.const_tensors.get(w.name)
    if t is None:
        raise UnsupportedOp(f"onnx export: {g.op}: the quantized weight must be a constant of the model")
    from ..ops.quant import dequantize

    f = dequantize(t, qtype=a["qtype"], n=a["n"], k=a["k"])
    return g.init(f._bytes(), "float32", f.shape, "dequantized")


@emits("dequantize")
def _deq(g, a, outs, w):
    return _dequantized(g, w, a)


@emits("qlinear")
def _qlinear(g, a, outs, x, w):
    return g.node("MatMul", [x.name, g.node("Transpose", [_dequantized(g, w, a)], perm=[1, 0])])


@emits("qembedding")
def _qembedding(g, a, outs, ids, w):
    return g.node("Gather", [_dequantized(g, w, a), ids.name], axis=0)


# ---- capture -----------------------------------------------------------------------------------

def _capture(fn, inputs):
    """The plan of ``fn(*inputs)`` (grad off), or UnsupportedOp saying why there is none.

    ember.compile's capture, with one change: tensors made outside the call (weights) count as
    variables, so nothing computed from them is folded into a new constant; a weight's slice or
    transpose stays an op of the graph (one initializer per weight, and slices of a position
    table follow a dynamic length). Only creation ops without inputs are folded. Where that
    capture fails (the model reads a weight's values while it runs), ember.compile's own is used."""
    from ..autograd import no_grad
    from ..plan import Capture, Compiled, out_leaves, out_structure

    class _Unfolded(Capture):
        def _variable(self, t):
            return True

    with no_grad():
        cap = _Unfolded(inputs).start()
        try:
            result = fn(*inputs)
        finally:
            cap.stop()
        if cap.reason is None and not cap.retry:
            return cap.plan(out_leaves(result, []), out_structure(result))
        c = Compiled(fn)
        for _ in range(4):      # in-place updates found on a capture make compile capture again
            c(*inputs)
            p = c.plan_for(*inputs)
            if p is not None:
                return p
            eager = c.stats()["eager"]
            if eager:
                raise UnsupportedOp(f"onnx export: the model cannot be captured as a plan: {next(iter(eager.values()))}")
    raise UnsupportedOp("onnx export: the model kept changing tensors in place while it was captured")


def _grow(x, axis: int):
    """``x`` one longer along ``axis`` (its first slice repeated): valid values for ids and masks."""
    from .. import ops
    from ..tensor import tensor

    return ops.concat([x, ops.take(x, tensor([0], device=x.device), axis=axis)], axis=axis)


def _walk_attrs(base, others, fit):
    """``base``'s attributes with every int that differs in ``others`` replaced by ``fit(...)``."""
    if isinstance(base, bool) or base is None:
        return base
    if isinstance(base, int):
        vals = [o for o in others]
        if any(v != base for v in vals):
            return fit(base, vals)
        return base
    if isinstance(base, (tuple, list)):
        return type(base)(_walk_attrs(b, [o[i] for o in others], fit) for i, b in enumerate(base))
    if isinstance(base, dict):
        return {k: _walk_attrs(v, [o[k] for o in others], fit) for k, v in base.items()}
    return base


def _canon(p) -> dict:
    """slot -> its number in order of first use (inputs first): two captures of the same code
    number their slots alike even where a tensor was made inside one and outside the other."""
    ids = {i: i for i in range(p.n_inputs)}
    for st in p.steps:
        for s in st.ins + st.outs:
            ids.setdefault(s, len(ids))
    for s in p.out_slots:
        ids.setdefault(s, len(ids))
    return ids


def _same_structure(p, q) -> bool:
    if len(p.steps) != len(q.steps) or p.n_inputs != q.n_inputs:
        return False
    cp, cq = _canon(p), _canon(q)
    if [cp[s] for s in p.out_slots] != [cq[s] for s in q.out_slots]:
        return False
    return all(a.name == b.name and [cp[s] for s in a.ins + a.outs] == [cq[s] for s in b.ins + b.outs]
               for a, b in zip(p.steps, q.steps))


def _const_of(p, q):
    """For each constant of plan ``p``, the tensor at the same place in plan ``q``."""
    cp, cq = _canon(p), _canon(q)
    by_id = {cq[s]: t for s, t in q.consts if s in cq}
    return [by_id.get(cp.get(s)) for s, _ in p.consts]


# ---- export --------------------------------------------------------------------------------------

def _names(given, n, default, what):
    if given is None:
        return default
    given = list(given)
    if len(given) != n or len(set(given)) != n or not all(isinstance(s, str) and s for s in given):
        raise ValueError(f"onnx export: {what} must be {n} distinct non-empty strings, got {given!r}")
    return given


def _default_input_names(fn, n):
    import inspect

    try:
        target = fn.forward if hasattr(fn, "forward") else fn
        params = [p.name for p in inspect.signature(target).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= n and len(set(params[:n])) == n:
        return params[:n]
    return [f"input_{i}" for i in range(n)]


def export(model_or_fn, example_inputs, path, *, opset: int = 17, input_names=None, output_names=None,
           dynamic_axes=None) -> dict:
    """Write ``model_or_fn`` (an ``ember.nn.Module`` or any function of tensors) as an ONNX model.

    ``example_inputs``: a Tensor or a tuple of Tensors, the call that is captured (once per
    dynamic axis more with ``dynamic_axes``). ``input_names`` default to the forward's parameter
    names, ``output_names`` to ``output`` (``output_0, output_1 ...`` for several).
    ``dynamic_axes``: ``{name: {axis: "symbol"}}`` or ``{name: [axis, ...]}`` for inputs (and
    outputs: their dims are named). ``path`` may be None: the model's bytes are returned in the
    result under ``"bytes"`` (no external data then).

    Returns ``{"path", "nodes", "initializers", "inputs", "outputs", "ops", "external"}``.
    Raises ``UnsupportedOp`` naming an op that has no ONNX mapping.

    >>> import ember, ember.onnx
    >>> r = ember.onnx.export(lambda a, b: a @ b + 1.0, (ember.ones((2, 3)), ember.ones((3, 4))), None)
    >>> r["ops"], r["inputs"]
    (['Add', 'MatMul'], ['a', 'b'])
    """
    from ..tensor import Tensor
    from .. import __version__

    if opset not in OPSETS:
        raise ValueError(f"onnx export: opset {opset} is not supported (this exporter writes "
                         f"{OPSETS.start}..{OPSETS.stop - 1})")
    inputs = (example_inputs,) if isinstance(example_inputs, Tensor) else tuple(example_inputs)
    if not all(isinstance(t, Tensor) for t in inputs):
        raise TypeError("onnx export: example_inputs must be a Tensor or a tuple of Tensors")
    in_names = _names(input_names, len(inputs), _default_input_names(model_or_fn, len(inputs)), "input_names")
    training = getattr(model_or_fn, "training", False) is True and hasattr(model_or_fn, "train")
    if training:
        model_or_fn.eval()           # exported in inference mode, as torch.onnx.export does; restored after
    try:
        return _export(model_or_fn, inputs, in_names, path, opset, output_names, dynamic_axes)
    finally:
        if training:
            model_or_fn.train(True)


def _export(model_or_fn, inputs, in_names, path, opset, output_names, dynamic_axes) -> dict:
    from .. import __version__

    plan = _capture(model_or_fn, inputs)
    n_out = len(plan.out_slots)
    out_names = _names(output_names, n_out, ["output"] if n_out == 1 else [f"output_{i}" for i in range(n_out)],
                       "output_names")
    # dynamic axes: {name: {axis: symbol}}
    dyn: dict = {}
    for name, axes in (dynamic_axes or {}).items():
        if name not in in_names and name not in out_names:
            raise ValueError(f"onnx export: dynamic_axes names {name!r}, which is neither an input "
                             f"{in_names} nor an output {out_names}")
        if isinstance(axes, dict):
            dyn[name] = {int(k): str(v) for k, v in axes.items()}
        else:
            dyn[name] = {int(k): f"{name}_dim{int(k)}" for k in axes}
    sizes: dict = {}
    g = Graph(opset)
    g.reserved = set(in_names) | set(out_names)
    if g.reserved & set(in_names) & set(out_names):
        raise ValueError(f"onnx export: names used for an input and an output: {sorted(set(in_names) & set(out_names))}")
    for name, t in zip(in_names, inputs):
        for ax, sym in dyn.get(name, {}).items():
            if not -t.ndim <= ax < t.ndim:
                raise ShapeError(f"onnx export: dynamic axis {ax} of input {name!r} is out of range for shape {t.shape}")
            ax %= t.ndim
            if sizes.setdefault(sym, t.shape[ax]) != t.shape[ax]:
                raise ShapeError(f"onnx export: dynamic axis {sym!r} has sizes {sizes[sym]} and {t.shape[ax]} "
                                 f"in the example inputs")
            g.dim_src.setdefault(sym, (name, ax))
    steps_attrs = [st.attrs for st in plan.steps]
    const_dims: dict = {}       # const index -> ("arange"/"full", Dim shape, values)
    out_dims: dict = {}
    if sizes:
        steps_attrs, const_dims, out_dims = _dynamic(model_or_fn, inputs, in_names, dyn, sizes, plan)

    # values
    vals: dict = {}
    metas: dict = {}
    for i, (name, t) in enumerate(zip(in_names, inputs)):
        vals[i] = V(name, t.shape, t.dtype)
    for ci, (s, t) in enumerate(plan.consts):
        if ci in const_dims:
            kind, dims, fill = const_dims[ci]
            g.op = "constant"
            if kind == "arange":
                name = _arange(g, {"num": dims[0], "start": fill[0], "step": fill[1]}, [V("", (), t.dtype)])
            else:
                name = g.node("Expand", [g.scalar(fill, t.dtype), g.ints(dims)])
            vals[s] = V(name, t.shape, t.dtype)
            continue
        name = g.init(t._bytes(), t.dtype.name, t.shape, "w")
        g.const_tensors[name] = t
        vals[s] = V(name, t.shape, t.dtype)
    for st, attrs in zip(plan.steps, steps_attrs):
        if st.multi == 2:
            raise UnsupportedOp(f"onnx export: the plan has a host step ({st.name}): training steps and "
                                f"random draws cannot be exported")
        emit = EMITTERS.get(st.name)
        if emit is None:
            raise UnsupportedOp(f"onnx export: op {st.name!r} has no ONNX mapping (ops with one: "
                                f"{len(EMITTERS)}; see ember.onnx.exporter.EMITTERS)")
        g.op = st.name
        metas_out = st.meta if st.multi else (st.meta,)
        outs = [V("", m.shape, m.dtype) for m in metas_out]
        args = [vals[i] for i in st.ins]
        res = emit(g, attrs, outs, *args)
        res = (res,) if isinstance(res, str) else tuple(res)
        for s, o, r in zip(st.outs, outs, res):
            vals[s] = V(r, o.shape, o.dtype)
    # outputs: Identity nodes give them their names
    out_infos = []
    for k, (s, name) in enumerate(zip(plan.out_slots, out_names)):
        v = vals[s]
        g.nodes.append(_node_proto("Identity", [v.name], [name], f"output/{name}"))
        dims = list(v.shape)
        for ax, sym in out_dims.get(k, {}).items():
            dims[ax] = sym
        for ax, sym in dyn.get(name, {}).items():
            if -len(dims) <= ax < len(dims):
                dims[ax % len(dims)] = sym
        out_infos.append(_value_info_proto(name, ONNX_TYPES[v.dtype.name], dims))
    in_infos = []
    for name, t in zip(in_names, inputs):
        dims = list(t.shape)
        for ax, sym in dyn.get(name, {}).items():
            dims[ax % t.ndim] = sym
        in_infos.append(_value_info_proto(name, ONNX_TYPES[t.dtype.name], dims))
    # initializers, inline or as external data
    total = sum(len(i.raw) for i in g.inits)
    external = path is not None and total > EXTERNAL_LIMIT
    data_name = os.path.basename(str(path)) + ".data" if external else None
    init_bytes, offset = [], 0
    fh = open(os.path.join(os.path.dirname(os.path.abspath(str(path))), data_name), "wb") if external else None
    try:
        for i in g.inits:
            if external and len(i.raw) >= EXTERNAL_MIN:
                pad = (-offset) % 64          # aligned for memory mapping
                fh.write(b"\0" * pad)
                offset += pad
                fh.write(i.raw)
                init_bytes.append(_tensor_proto(i.name, i.shape, ONNX_TYPES[i.dtype], external={
                    "location": data_name, "offset": offset, "length": len(i.raw)}))
                offset += len(i.raw)
            else:
                init_bytes.append(_tensor_proto(i.name, i.shape, ONNX_TYPES[i.dtype], raw=i.raw))
    finally:
        if fh is not None:
            fh.close()
    graph = (b"".join(_len(1, n) for n in g.nodes) + _str(2, "ember") + b"".join(_len(5, t) for t in init_bytes)
             + b"".join(_len(11, i) for i in in_infos) + b"".join(_len(12, o) for o in out_infos))
    # ModelProto: ir_version, producer name and version, graph, opset_import {domain "", version}
    model = (_int(1, _IR[opset]) + _str(2, "ember") + _str(3, __version__) + _len(7, graph)
             + _len(8, _str(1, "") + _int(2, opset)))
    result = {"path": None if path is None else str(path), "nodes": len(g.nodes), "initializers": len(g.inits),
              "inputs": in_names, "outputs": out_names, "external": data_name,
              "ops": sorted(g.op_types)}
    if path is None:
        result["bytes"] = model
    else:
        with open(path, "wb") as f:
            f.write(model)
    return result


def _dynamic(fn, inputs, in_names, dyn, sizes, plan):
    """Capture again with each symbol's axes one longer; attributes and constants that changed
    become Dims. Returns (attrs per step, {const index: (kind, dims, fill)}, {output: {axis: symbol}})."""
    syms = sorted(sizes)

    def grown(which):
        out = []
        for name, t in zip(in_names, inputs):
            for ax, sym in dyn.get(name, {}).items():
                if sym in which:
                    t = _grow(t, ax % t.ndim)
            out.append(t)
        return out

    varied = []
    for s in syms:
        p = _capture(fn, grown({s}))
        if not _same_structure(plan, p):
            raise UnsupportedOp(f"onnx export: the captured ops change when dynamic axis {s!r} changes size "
                                f"({sizes[s]} -> {sizes[s] + 1}): the model's Python code branches on it; "
                                f"export with that axis static (or at a size where it does not branch)")
        varied.append((s, sizes[s] + 1, p))
    extra = None
    if len(syms) > 1:
        p = _capture(fn, grown(set(syms)))
        if not _same_structure(plan, p):
            raise UnsupportedOp(f"onnx export: the captured ops change when the dynamic axes {syms} all change size")
        extra = ({s: sizes[s] + 1 for s in syms}, p)

    def fitter(where):
        def fit(base, vals):
            all_val = vals[-1] if extra is not None else None
            single = vals[:len(varied)]
            d = _fit(base, sizes, [(s, n, v) for (s, n, _), v in zip(varied, single)],
                     None if extra is None else (extra[0], all_val))
            if d is None:
                raise UnsupportedOp(f"onnx export: {where}: a size ({base}, then {vals}) follows the dynamic axes "
                                    f"{syms} in a way export cannot write (not k*n + c)")
            return d
        return fit

    others = [p for _, _, p in varied] + ([extra[1]] if extra is not None else [])
    attrs = [_walk_attrs(st.attrs, [o.steps[i].attrs for o in others], fitter(f"op {st.name!r} (step {i})"))
             for i, st in enumerate(plan.steps)]
    consts = {}
    other_consts = [_const_of(plan, o) for o in others]
    for ci, (s, t) in enumerate(plan.consts):
        shapes = [m[ci].shape if m[ci] is not None else None for m in other_consts]
        if None in shapes:
            raise UnsupportedOp(f"onnx export: a constant of shape {t.shape} is missing from a capture at another size")
        if all(sh == t.shape for sh in shapes):
            continue
        dims = _walk_attrs(tuple(t.shape), shapes, fitter(f"a constant of shape {t.shape}"))
        v = t.tolist()
        flat = v if isinstance(v, list) else [v]
        while flat and isinstance(flat[0], list):
            flat = [y for x in flat for y in x]
        if t.ndim == 1 and len(flat) >= 2 and all(flat[i] == flat[0] + i * (flat[1] - flat[0]) for i in range(len(flat))):
            consts[ci] = ("arange", dims, (flat[0], flat[1] - flat[0]))
        elif flat and all(x == flat[0] for x in flat):
            consts[ci] = ("full", dims, flat[0])
        else:
            raise UnsupportedOp(f"onnx export: a constant of shape {t.shape} changes with the dynamic axes and is "
                                f"neither a range nor filled with one value; export with those axes static")
    outs = {}
    for k, s in enumerate(plan.out_slots):
        base = _out_shape(plan, s)
        shapes = [_out_shape(o, o.out_slots[k]) for o in others]
        if base is None or any(sh is None for sh in shapes):
            continue
        dims = {}
        for ax, n in enumerate(base):
            vals = [sh[ax] for sh in shapes]
            if any(v != n for v in vals):
                d = _fit(n, sizes, [(s_, n_, v) for (s_, n_, _), v in zip(varied, vals[:len(varied)])],
                         None if extra is None else (extra[0], vals[-1]))
                dims[ax] = d.syms[0] if d is not None and d.ks == (1,) and d.c == 0 and len(d.syms) == 1 \
                    else f"output{k}_dim{ax}"
        if dims:
            outs[k] = dims
    return attrs, consts, outs


def _out_shape(plan, slot):
    for st in plan.steps:
        if slot in st.outs:
            metas = st.meta if st.multi else (st.meta,)
            return tuple(metas[st.outs.index(slot)].shape)
    return None
