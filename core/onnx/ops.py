"""The one ONNX op table: ONNX operator name (and the opset its semantics start at) -> a handler
that computes the node with public ember functions.

Both the run-time loader (``ember.onnx.load``) and the code generator (``ember import``) use
this table. A handler gets a context ``c`` and the node's inputs (None for an omitted optional
input) and returns the node's outputs. It reads attributes with ``c.i/f/s/ints_attr/...``,
the values of shape-like inputs with ``c.ints``/``c.scalar``, and computes ONLY through
``c.call(fn, *args, **kw)`` with ``fn`` a public function of ``ember`` or of
``ember.onnx.functional`` — which is what lets the code generator write each call out as a
line of Python. Every attribute a node carries must be read by its handler, or loading fails
with ``UnsupportedOp`` (nothing is silently ignored).

>>> from ember.onnx.ops import TABLE, supported_ops
>>> "Conv" in TABLE and "Resize" in TABLE
True
>>> [since for since, _ in TABLE["Squeeze"]]
[1, 13]
"""
from __future__ import annotations

import math
import operator

import ember as E

from .. import dtypes as _dt
from ..errors import ShapeError, UnsupportedOp
from . import functional as F
from . import proto
from .runtime import DEVICE

# op name -> [(since_version, handler)], sorted by since_version
TABLE: dict = {}


MS = "com.microsoft"        # onnxruntime's contrib operators: keys "com.microsoft:Name"
EMBER = "ai.ember"          # nodes ember's own load-time rewrites write (ember.onnx.fuse)


def onnx_op(*names, since: int = 1, domain: str = "ai.onnx"):
    """Register a handler for ONNX ops ``names`` from opset ``since`` on (until the next
    registration of the same name); ``domain`` other than the default one prefixes the key
    (``"com.microsoft:Attention"``)."""
    def deco(fn):
        for n in names:
            key = n if domain == "ai.onnx" else f"{domain}:{n}"
            entries = TABLE.setdefault(key, [])
            entries.append((since, fn))
            entries.sort(key=lambda e: e[0])
        return fn
    return deco


def supported_ops() -> list:
    """The ONNX operator names ember can load (contrib ones as ``"com.microsoft:Name"``)."""
    return sorted(TABLE)


DOMAINS = ("ai.onnx", MS, EMBER)


def resolve(node, opsets):
    """The handler for ``node`` under the model's opsets, and the opset: UnsupportedOp naming
    the op, the opset and the node when there is none. A contrib node runs under the model's
    default-domain opset (its handler reads its own domain's version where that matters)."""
    domain = node.domain or "ai.onnx"
    if domain == "onnx":
        domain = "ai.onnx"
    if domain not in DOMAINS:
        raise UnsupportedOp(f"ONNX node {node.label} ({node.op_type}): operators of domain {domain!r} "
                            f"(opset {opsets.get(domain, '?')}) are not supported by ember; only the "
                            f"default ONNX domain and com.microsoft are")
    opset = opsets.get("ai.onnx", 1)
    key = node.op_type if domain == "ai.onnx" else f"{domain}:{node.op_type}"
    entries = TABLE.get(key)
    if not entries:
        what = node.op_type if domain == "ai.onnx" else f"{node.op_type} of domain {domain!r}"
        raise UnsupportedOp(f"ONNX node {node.label}: operator {what} (opset {opsets.get(domain, opset)}) is "
                            f"not supported by ember (ember.onnx.supported_ops() lists what is)")
    if domain != "ai.onnx":
        return entries[-1][1], opset
    handler = None
    for since, fn in entries:
        if since <= opset:
            handler = fn
    if handler is None:
        raise UnsupportedOp(f"ONNX node {node.label}: operator {node.op_type} at opset {opset} is not "
                            f"supported by ember (supported from opset {entries[0][0]})")
    return handler, opset


# ---- helpers ----------------------------------------------------------------------------------

def _dtype(c, code, what="to"):
    return proto.ember_dtype(code, f"{c.where()}: attribute {what!r}")


def _spatial(c, x, w_shape=None, *, kernel=None, pool=False):
    """Normalise ONNX conv/pool attributes for an N-D spatial input: returns kernel, strides,
    dilations and ((begin, end), ...) pads (auto_pad resolved)."""
    nsp = x.ndim - 2
    if nsp not in (1, 2):
        c.unsupported(f"{nsp}-D spatial input (shape {x.shape}; ember has 1-D and 2-D {'pooling' if pool else 'convolution'})")
    k = c.ints_attr("kernel_shape", None)
    if k is None:
        if kernel is None:
            raise c.check(False, "kernel_shape is required")
        k = list(kernel)
    if len(k) != nsp:
        c.check(False, f"kernel_shape {k} does not match the {nsp} spatial dims of input {x.shape}")
    strides = c.ints_attr("strides", None) or [1] * nsp
    dil = c.ints_attr("dilations", None) or [1] * nsp
    pads = c.ints_attr("pads", None) or [0] * (2 * nsp)
    auto = c.s("auto_pad", "NOTSET")
    if len(strides) != nsp or len(dil) != nsp or len(pads) != 2 * nsp:
        c.check(False, f"strides {strides}, dilations {dil} or pads {pads} do not match {nsp} spatial dims")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pairs = []
        for i in range(nsp):
            n = x.shape[2 + i]
            out = -(-n // strides[i])
            total = max(0, (out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 - n)
            small, big = total // 2, total - total // 2
            pairs.append((small, big) if auto == "SAME_UPPER" else (big, small))
    elif auto == "VALID":
        pairs = [(0, 0)] * nsp
    elif auto == "NOTSET":
        pairs = [(pads[i], pads[i + nsp]) for i in range(nsp)]
    else:
        c.unsupported(f"auto_pad={auto!r}")
    return list(k), list(strides), list(dil), pairs


def _one(v):
    """(a, a) -> a, for shorter generated code."""
    return v[0] if len(set(v)) == 1 else tuple(v)


def _pads_arg(pairs):
    if all(p == pairs[0] for p in pairs) and pairs[0][0] == pairs[0][1]:
        return pairs[0][0]
    return tuple(tuple(p) for p in pairs)


# ---- elementwise ------------------------------------------------------------------------------

def _e(name):
    """``ember.<name>``, or a stand-in that fails with UnsupportedOp if ember lacks it."""
    fn = getattr(E, name, None)
    if fn is None:
        def missing(*a, **k):
            raise UnsupportedOp(f"ember has no function {name!r}")
        missing.__name__ = name
        return missing
    return fn


def _unary(name, fn):
    @onnx_op(name)
    def h(c, x):
        return c.call(fn, x)
    return h


for _name, _fn in [("Abs", "abs"), ("Neg", "negative"), ("Exp", "exp"), ("Log", "log"), ("Sqrt", "sqrt"),
                   ("Reciprocal", "reciprocal"), ("Floor", "floor"), ("Ceil", "ceil"), ("Round", "round"),
                   ("Sign", "sign"), ("Sin", "sin"), ("Cos", "cos"), ("Tanh", "tanh"),
                   ("Erf", "erf"), ("Sigmoid", "sigmoid"), ("Relu", "relu"), ("IsNaN", "isnan"),
                   ("Not", "logical_not")]:
    _unary(_name, _e(_fn))
for _name, _fn in [("Tan", F.tan), ("Softplus", F.softplus), ("Softsign", F.softsign),
                   ("HardSwish", F.hard_swish), ("Mish", F.mish), ("Sinh", F.sinh), ("Cosh", F.cosh),
                   ("Asinh", F.asinh), ("Acosh", F.acosh), ("Atanh", F.atanh)]:
    _unary(_name, _fn)


def _binary(name, fn, since=1):
    @onnx_op(name, since=since)
    def h(c, a, b):
        return c.call(fn, a, b)
    return h


for _name, _fn in [("Equal", "equal"), ("Less", "less"), ("Greater", "greater"),
                   ("LessOrEqual", "less_equal"), ("GreaterOrEqual", "greater_equal"),
                   ("And", "logical_and"), ("Or", "logical_or"), ("Xor", "logical_xor")]:
    _binary(_name, _e(_fn))
for _name, _fn in [("Add", "add"), ("Sub", "subtract"), ("Mul", "multiply")]:
    _binary(_name, _e(_fn), since=7)


def _legacy(name, fn):
    # Opsets 1-6: B broadcasts only with broadcast=1, aligned at `axis` (default: trailing).
    @onnx_op(name, since=1)
    def h(c, a, b):
        c.attr("consumed_inputs", None)
        if c.i("broadcast", 0):
            axis = c.i("axis", a.ndim - b.ndim)
            axis = axis % a.ndim if a.ndim else 0
            shape = (1,) * axis + tuple(b.shape) + (1,) * (a.ndim - axis - b.ndim)
            if shape != tuple(b.shape):
                b = c.call(E.reshape, b, shape)
        else:
            c.attr("axis", None)
            c.check(a.shape == b.shape, f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return fn(c, a, b)
    return h


_legacy("Add", lambda c, a, b: c.call(E.add, a, b))
_legacy("Sub", lambda c, a, b: c.call(E.subtract, a, b))
_legacy("Mul", lambda c, a, b: c.call(E.multiply, a, b))
_legacy("Div", lambda c, a, b: div(c, a, b))


@onnx_op("Div", since=7)
def div(c, a, b):
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return c.call(F.int_divide, a, b)
    return c.call(E.divide, a, b)


@onnx_op("Pow", since=7)
def pow_(c, a, b):
    y = c.call(E.pow, a, b)
    return y if y.dtype is a.dtype else c.call(E.astype, y, a.dtype)


@onnx_op("Mod", since=10)
def mod(c, a, b):
    if c.i("fmod", 0):
        return c.call(F.fmod, a, b)
    return c.call(E.remainder, a, b)


def _variadic(name, fn):
    @onnx_op(name)
    def h(c, *xs):
        c.check(len(xs) >= 1, "needs at least one input")
        return xs[0] if len(xs) == 1 else c.call(F.variadic, fn, *xs)
    return h


_variadic("Max", E.maximum)
_variadic("Min", E.minimum)
_variadic("Sum", E.add)


@onnx_op("Mean")
def mean_(c, *xs):
    c.check(len(xs) >= 1, "needs at least one input")
    return xs[0] if len(xs) == 1 else c.call(F.mean_of, *xs)


@onnx_op("IsInf", since=10)
def isinf(c, x):
    pos, neg = c.i("detect_positive", 1), c.i("detect_negative", 1)
    if pos and neg:
        return c.call(E.isinf, x)
    return c.call(F.isinf, x, bool(pos), bool(neg))


@onnx_op("LeakyRelu")
def leaky_relu(c, x):
    return c.call(E.leaky_relu, x, c.f("alpha", 0.01))


@onnx_op("PRelu")
def prelu(c, x, slope):
    return c.call(F.prelu, x, slope)


def _with_float_attrs(name, fn, attrs, since=1):
    @onnx_op(name, since=since)
    def h(c, x):
        return c.call(fn, x, *[c.f(a, d) for a, d in attrs])
    return h


for _name, _fn, _attrs, _since in [
        ("Elu", F.elu, [("alpha", 1.0)], 1), ("Celu", F.celu, [("alpha", 1.0)], 12),
        ("Selu", F.selu, [("alpha", 1.67326319217681884765625), ("gamma", 1.05070102214813232421875)], 1),
        ("ThresholdedRelu", F.thresholded_relu, [("alpha", 1.0)], 10),
        ("HardSigmoid", F.hard_sigmoid, [("alpha", 0.2), ("beta", 0.5)], 1),
        ("Shrink", F.shrink, [("lambd", 0.5), ("bias", 0.0)], 9)]:
    _with_float_attrs(_name, _fn, _attrs, _since)


@onnx_op("Gelu", since=20)
def gelu(c, x):
    approx = c.s("approximate", "none")
    if approx not in ("none", "tanh"):
        c.unsupported(f"approximate={approx!r}")
    return c.call(E.gelu, x, approx) if approx != "none" else c.call(E.gelu, x)


@onnx_op("Swish", since=24)
def swish(c, x):
    alpha = c.f("alpha", 1.0)
    if alpha == 1.0:
        return c.call(E.silu, x)
    return c.call(E.multiply, x, c.call(E.sigmoid, c.call(E.multiply, x, alpha)))


@onnx_op("Clip", since=1)
def clip_attrs(c, x):
    lo, hi = c.f("min", -math.inf), c.f("max", math.inf)
    c.attr("consumed_inputs", None)
    return c.call(E.clip, x, lo, hi)


@onnx_op("Clip", since=11)
def clip(c, x, lo=None, hi=None):
    lo = _bound(c, lo, "min")
    hi = _bound(c, hi, "max")
    if lo is None and hi is None:
        return x
    return c.call(E.clip, x, lo, hi)


def _bound(c, t, what):
    if t is None:
        return None
    if t.device != "meta":
        return c.scalar(t, what)
    return t


@onnx_op("Where", since=9)
def where(c, cond, a, b):
    return c.call(E.where, cond, a, b)


@onnx_op("Cast", since=6)
def cast(c, x):
    code = c.i("to")
    dt = _dtype(c, code)
    c.i("saturate", 1)
    if "round_mode" in c.node.attrs:
        c.s("round_mode")
    if code in proto.WIDENED:       # to int8/int16/uint16, held as int32: wrap into the narrow range
        from .quant import tag_narrow
        lo, hi = _QTYPES[code]
        return tag_narrow(c.call(F.wrap_int, x, lo, hi), code)
    return x if x.dtype is dt else c.call(E.astype, x, dt)


@onnx_op("CastLike", since=15)
def cast_like(c, x, like):
    c.i("saturate", 1)
    return x if x.dtype is like.dtype else c.call(E.astype, x, like.dtype)


@onnx_op("Identity")
def identity(c, x):
    return x


@onnx_op("Dropout")
def dropout(c, x, ratio=None, training=None):
    c.f("ratio", 0.5)
    c.i("is_test", 0)
    c.i("seed", 0)
    c.attr("consumed_inputs", None)
    if training is not None and c.scalar(training, "training_mode"):
        # training-mode dropout is random; only ratio 0 (the identity) is deterministic
        if ratio is None or c.scalar(ratio, "ratio") != 0:
            c.unsupported("Dropout with training_mode=True and a non-zero ratio (ember runs inference)")
    if c.wants(1):
        return x, c.call(E.full, x.shape, True, dtype=_dt.bool_, device=DEVICE)
    return x


# ---- creation and shapes ----------------------------------------------------------------------

@onnx_op("Constant")
def constant(c):
    for name in ("sparse_value", "value_string", "value_strings"):
        if name in c.node.attrs:
            c.attr(name)
            c.unsupported(f"Constant attribute {name!r}")
    if "value" in c.node.attrs:
        return c.tensor_attr("value")
    for name, dt in (("value_float", _dt.float32), ("value_floats", _dt.float32),
                     ("value_int", _dt.int64), ("value_ints", _dt.int64)):
        if name in c.node.attrs:
            return E.tensor(c.attr(name), dtype=dt, device="python")
    c.check(False, "Constant has no value attribute")


@onnx_op("ConstantOfShape", since=9)
def constant_of_shape(c, shape):
    v = c.tensor_attr("value", None)
    dims = tuple(c.ints(shape, "shape"))
    if any(d < 0 for d in dims):
        c.check(False, f"negative dimension in shape {dims}")
    if v is None:
        return c.call(E.full, dims, 0.0, dtype=_dt.float32, device=DEVICE)
    c.check(v.size == 1, f"value must have one element, got shape {v.shape}")
    return c.call(E.full, dims, c.scalar(v), dtype=v.dtype, device=DEVICE)


@onnx_op("Range", since=11)
def range_(c, start, limit, delta):
    c.check(None not in (start, limit, delta), "start, limit and delta are all required")
    vals = [c.scalar(t, n) for t, n in ((start, "start"), (limit, "limit"), (delta, "delta"))]
    return c.call(F.range_, *vals, start.dtype, device=DEVICE)


@onnx_op("EyeLike", since=9)
def eye_like(c, x):
    dt = c.i("dtype", None)
    dt = x.dtype if dt is None else _dtype(c, dt, "dtype")
    c.check(x.ndim == 2, f"input must be 2-D, got {x.shape}")
    return c.call(F.eye_like, x, c.i("k", 0), dt)


@onnx_op("Shape")
def shape(c, x):
    start, end = c.i("start", 0), c.i("end", None)
    return c.call(F.shape, x, start, end) if (start, end) != (0, None) else c.call(F.shape, x)


@onnx_op("Size")
def size(c, x):
    return c.call(F.size, x)


@onnx_op("Reshape", since=1)
def reshape_v1(c, x):
    c.attr("consumed_inputs", None)
    return c.call(F.reshape, x, tuple(c.ints_attr("shape")))


@onnx_op("Reshape", since=5)
def reshape(c, x, shape):
    c.check(shape is not None, "the shape input is missing (an empty name)")
    dims = c.ints(shape, "shape")
    allowzero = c.i("allowzero", 0)
    if allowzero or 0 not in dims:
        return c.call(E.reshape, x, tuple(dims))
    return c.call(F.reshape, x, tuple(dims))


@onnx_op("Flatten")
def flatten(c, x):
    axis = c.i("axis", 1)
    return c.call(F.flatten, x, axis)


@onnx_op("Transpose")
def transpose(c, x):
    perm = c.ints_attr("perm", None)
    if perm is None:
        perm = list(range(x.ndim))[::-1]
    c.check(sorted(perm) == list(range(x.ndim)), f"perm {perm} is not a permutation of {x.ndim} axes")
    return c.call(E.permute_dims, x, tuple(perm))


@onnx_op("Squeeze", since=1)
def squeeze_v1(c, x):
    axes = c.ints_attr("axes", None)
    return c.call(F.squeeze, x, axes) if axes is not None else c.call(F.squeeze, x)


@onnx_op("Squeeze", since=13)
def squeeze(c, x, axes=None):
    axes = c.ints(axes, "axes")
    return c.call(F.squeeze, x, axes) if axes is not None else c.call(F.squeeze, x)


@onnx_op("Unsqueeze", since=1)
def unsqueeze_v1(c, x):
    return c.call(F.unsqueeze, x, c.ints_attr("axes"))


@onnx_op("Unsqueeze", since=13)
def unsqueeze(c, x, axes):
    return c.call(F.unsqueeze, x, c.ints(axes, "axes"))


@onnx_op("Expand", since=8)
def expand(c, x, shape):
    return c.call(F.expand, x, tuple(c.ints(shape, "shape")))


@onnx_op("Tile", since=6)
def tile(c, x, repeats):
    reps = c.ints(repeats, "repeats")
    c.check(len(reps) == x.ndim, f"repeats {reps} must have one entry per axis of {x.shape}")
    return c.call(E.tile, x, tuple(reps))


@onnx_op("Concat", since=4)
def concat(c, *xs):
    axis = c.i("axis")
    return c.call(E.concat, list(xs), axis=axis)


@onnx_op("Split", since=2)
def split_v2(c, x):
    return _split(c, x, c.ints_attr("split", None))


@onnx_op("Split", since=13)
def split(c, x, sizes=None):
    if c.opset >= 18:
        n = c.i("num_outputs", None)
        if sizes is None and n is not None:
            axis = c.i("axis", 0)
            return _split(c, x, F.split_sizes(x.shape[axis % max(x.ndim, 1)], n))
    return _split(c, x, c.ints(sizes, "split"))


def _split(c, x, sizes):
    axis = c.i("axis", 0)
    n_out = len(c.node.outputs)
    if sizes is None:
        n = x.shape[axis % max(x.ndim, 1)]
        c.check(n % n_out == 0, f"cannot split axis {axis} of size {n} into {n_out} equal parts")
        sizes = [n // n_out] * n_out
    c.check(len(sizes) == n_out, f"split {sizes} gives {len(sizes)} pieces for {n_out} outputs")
    return c.call(F.split, x, list(sizes), axis)


@onnx_op("Slice", since=1)
def slice_v1(c, x):
    return _slice(c, x, c.ints_attr("starts"), c.ints_attr("ends"), c.ints_attr("axes", None), None)


@onnx_op("Slice", since=10)
def slice_(c, x, starts, ends, axes=None, steps=None):
    c.check(starts is not None and ends is not None, "the starts and ends inputs are required (an empty name)")
    return _slice(c, x, c.ints(starts, "starts"), c.ints(ends, "ends"), c.ints(axes, "axes"),
                  c.ints(steps, "steps"))


_BIG = 1 << 31


def _slice(c, x, starts, ends, axes, steps):
    """ONNX Slice clamps exactly like Python slicing, so it becomes ``x[a:b:s, ...]``; the
    INT64 "to the end" markers exporters write become empty bounds."""
    nd = x.ndim
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    c.check(len(starts) == len(ends) == len(axes) == len(steps),
            f"starts {starts}, ends {ends}, axes {axes} and steps {steps} differ in length")
    c.check(all(-nd <= a < nd for a in axes), f"axes {axes} out of range for rank {nd}")
    axes = [a % nd for a in axes]
    c.check(len(set(axes)) == len(axes), f"repeated axis in {axes}")
    key = [slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps):
        c.check(st != 0, "step 0")
        if st > 0:
            s = None if s == 0 or s <= -_BIG else s
            e = None if e >= _BIG else (0 if e <= -_BIG else e)
        else:
            s = None if s >= _BIG else s
            e = None if e <= -_BIG else e
        key[a] = slice(s, e, None if st == 1 else st)
    while key and key[-1] == slice(None):
        key.pop()
    if not key:
        return x
    return c.call(operator.getitem, x, tuple(key))


@onnx_op("Gather")
def gather(c, x, indices):
    c.check(x.ndim >= 1, f"data must have rank >= 1, got a scalar")
    return c.call(F.gather, x, indices, c.i("axis", 0))


@onnx_op("GatherElements", since=11)
def gather_elements(c, x, indices):
    return c.call(F.gather_elements, x, indices, c.i("axis", 0))


@onnx_op("GatherND", since=11)
def gather_nd(c, x, indices):
    b = c.i("batch_dims", 0)
    return c.call(F.gather_nd, x, indices, b)


@onnx_op("ScatterElements", since=11)
def scatter_elements(c, x, indices, updates):
    red = c.s("reduction", "none")
    if red != "none":
        c.unsupported(f"reduction={red!r}")
    return c.call(F.scatter_elements, x, indices, updates, c.i("axis", 0), F.int_list)


@onnx_op("ScatterND", since=11)
def scatter_nd(c, x, indices, updates):
    red = c.s("reduction", "none")
    if red != "none":
        c.unsupported(f"reduction={red!r}")
    return c.call(F.scatter_nd, x, indices, updates, F.int_list)


@onnx_op("OneHot", since=9)
def one_hot(c, indices, depth, values):
    d = c.scalar(depth, "depth")
    return c.call(F.one_hot, indices, int(d), values, c.i("axis", -1))


@onnx_op("Trilu", since=14)
def trilu(c, x, k=None):
    kk = 0 if k is None else int(c.scalar(k, "k"))
    return c.call(F.trilu, x, kk, bool(c.i("upper", 1)))


@onnx_op("DepthToSpace", since=1)
def depth_to_space(c, x):
    return c.call(F.depth_to_space, x, c.i("blocksize"), c.s("mode", "DCR"))


@onnx_op("SpaceToDepth", since=1)
def space_to_depth(c, x):
    return c.call(F.space_to_depth, x, c.i("blocksize"))


@onnx_op("Pad", since=2)
def pad_v2(c, x):
    return _pad(c, x, c.ints_attr("pads"), c.f("value", 0.0), None)


@onnx_op("Pad", since=11)
def pad(c, x, pads, value=None, axes=None):
    v = 0 if value is None else c.scalar(value, "constant_value")
    return _pad(c, x, c.ints(pads, "pads"), v, c.ints(axes, "axes"))


def _pad(c, x, pads, value, axes):
    mode = c.s("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        c.unsupported(f"mode={mode!r}")
    nd = x.ndim
    axes = list(range(nd)) if axes is None else [a % nd for a in axes]
    k = len(axes)
    c.check(len(pads) == 2 * k, f"{len(pads)} pads for {k} axes of input {x.shape}")
    width = [(0, 0)] * nd
    for j, a in enumerate(axes):
        width[a] = (pads[j], pads[j + k])
    if x.dtype.kind == "f":
        value = float(value)
    elif x.dtype is _dt.bool_:
        value = bool(value)
    else:
        value = int(value)
    kw = {}
    if mode != "constant":
        kw["mode"] = mode
    elif value != 0:
        kw["value"] = value
    return c.call(E.pad, x, tuple(width), **kw)


# ---- matmul, conv, pooling, normalization ------------------------------------------------------

@onnx_op("MatMul")
def matmul(c, a, b):
    return c.call(E.matmul, a, b)


@onnx_op("Gemm")
def gemm(c, a, b, bias=None):
    alpha, beta = c.f("alpha", 1.0), c.f("beta", 1.0)
    ta, tb = c.i("transA", 0), c.i("transB", 0)
    c.i("broadcast", 0)
    c.check(a.ndim == 2 and b.ndim == 2, f"A and B must be 2-D, got {a.shape} and {b.shape}")
    n = b.shape[0 if tb else 1]
    plain_bias = bias is None or beta == 0.0 or (beta == 1.0 and tuple(bias.shape) == (n,))
    if not ta and alpha == 1.0 and plain_bias and a.dtype.kind == "f" and b.dtype is a.dtype:
        # x @ w.T + bias as one linear op: B as stored when transB=1, else transposed once (a
        # constant B is folded)
        w = b if tb else c.call(E.permute_dims, b, (1, 0))
        return c.call(E.linear, a, w, bias) if bias is not None and beta != 0.0 else c.call(E.linear, a, w)
    if ta:
        a = c.call(E.permute_dims, a, (1, 0))
    if tb:
        b = c.call(E.permute_dims, b, (1, 0))
    y = c.call(E.matmul, a, b)
    if alpha != 1.0:
        y = c.call(E.multiply, y, alpha)
    if bias is not None and beta != 0.0:
        y = c.call(E.add, y, bias if beta == 1.0 else c.call(E.multiply, bias, beta))
    return y


@onnx_op("Einsum", since=12)
def einsum(c, *xs):
    return c.call(F.einsum, c.s("equation"), *xs)


def _conv_kw(c, x, w):
    """Conv attributes as ember.conv2d keywords (only the non-default ones); for a 1-D input the
    single-axis values, as F.conv1d takes them."""
    k, s, d, p = _spatial(c, x, kernel=w.shape[2:])
    groups = c.i("group", 1)
    if x.ndim == 3:
        return {"stride": s[0], "padding": p[0], "dilation": d[0], "groups": groups}
    kw = {}
    if s != [1, 1]:
        kw["stride"] = _one(s)
    if p != [(0, 0), (0, 0)]:
        kw["padding"] = _pads_arg(p)
    if d != [1, 1]:
        kw["dilation"] = _one(d)
    if groups != 1:
        kw["groups"] = groups
    return kw


@onnx_op("Conv")
def conv(c, x, w, b=None):
    kw = _conv_kw(c, x, w)
    if x.ndim == 3:
        return c.call(F.conv1d, x, w, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    return c.call(E.conv2d, x, w, b, **kw)


@onnx_op("ConvTranspose")
def conv_transpose(c, x, w, b=None):
    nsp = x.ndim - 2
    groups = c.i("group", 1)
    out_pad = c.ints_attr("output_padding", None) or [0] * nsp
    out_shape = c.ints_attr("output_shape", None)
    auto = c.s("auto_pad", "NOTSET")
    k, s, d, p = _spatial(c, x, kernel=w.shape[2:])
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [x.shape[2 + i] * s[i] for i in range(nsp)]
        out_shape = out_shape[-nsp:]
        p = []
        for i in range(nsp):
            total = s[i] * (x.shape[2 + i] - 1) + out_pad[i] + (k[i] - 1) * d[i] + 1 - out_shape[i]
            if total < 0:
                out_pad = list(out_pad)
                out_pad[i] -= total
                total = 0
            half = total // 2
            p.append((half, total - half) if auto == "SAME_UPPER" else (total - half, half))
    if x.ndim == 3:
        return c.call(F.conv_transpose1d, x, w, b, s[0], p[0], out_pad[0], d[0], groups)
    kw = {}
    if s != [1, 1]:
        kw["stride"] = _one(s)
    if p != [(0, 0), (0, 0)]:
        kw["padding"] = _pads_arg(p)
    if list(out_pad) != [0, 0]:
        kw["output_padding"] = _one(out_pad)
    if groups != 1:
        kw["groups"] = groups
    if d != [1, 1]:
        kw["dilation"] = _one(d)
    return c.call(E.conv_transpose2d, x, w, b, **kw)


@onnx_op("MaxPool")
def max_pool(c, x):
    k, s, d, p = _spatial(c, x, pool=True)
    ceil = c.i("ceil_mode", 0)
    if c.i("storage_order", 0) and c.wants(1):
        c.unsupported("storage_order=1")
    if c.wants(1):
        c.unsupported("the Indices output of MaxPool")
    if x.ndim == 3:
        kw = {"dilation": (1, d[0])} if d[0] != 1 else {}
        if ceil:
            kw["ceil_mode"] = True
        return c.call(F.pool1d, E.max_pool2d, x, k[0], s[0], p[0], **kw)
    if _big_pads(k, d, p):
        return c.call(F.pool_big_pads, "max", x, tuple(k), tuple(s), tuple(p), tuple(d), bool(ceil))
    kw = {"stride": _one(s)}
    if p != [(0, 0), (0, 0)]:
        kw["padding"] = _pads_arg(p)
    if d != [1, 1]:
        kw["dilation"] = _one(d)
    if ceil:
        kw["ceil_mode"] = True
    return c.call(E.max_pool2d, x, _one(k), **kw)


def _big_pads(k, d, p):
    return any(max(pp) * 2 > (kk - 1) * dd + 1 for kk, dd, pp in zip(k, d, p))


@onnx_op("AveragePool")
def avg_pool(c, x):
    k, s, d, p = _spatial(c, x, pool=True)
    if d != [1] * len(d):
        c.unsupported(f"dilations={d} for AveragePool")
    ceil = c.i("ceil_mode", 0)
    include = c.i("count_include_pad", 0)
    kw = {} if include else {"count_include_pad": False}
    if ceil:
        kw["ceil_mode"] = True
    if x.ndim == 3:
        return c.call(F.pool1d, E.avg_pool2d, x, k[0], s[0], p[0], **kw)
    if _big_pads(k, d, p):
        return c.call(F.pool_big_pads, "avg", x, tuple(k), tuple(s), tuple(p), ceil_mode=bool(ceil),
                      count_include_pad=bool(include))
    kw["stride"] = _one(s)
    if p != [(0, 0), (0, 0)]:
        kw["padding"] = _pads_arg(p)
    return c.call(E.avg_pool2d, x, _one(k), **kw)


@onnx_op("GlobalAveragePool")
def global_avg_pool(c, x):
    return c.call(E.mean, x, axis=tuple(range(2, x.ndim)), keepdims=True)


@onnx_op("GlobalMaxPool")
def global_max_pool(c, x):
    return c.call(E.max, x, axis=tuple(range(2, x.ndim)), keepdims=True)


@onnx_op("BatchNormalization", since=1)
def batch_norm(c, x, scale, bias, mean, var):
    eps = c.f("epsilon", 1e-5)
    c.f("momentum", 0.9)
    c.i("spatial", 1)
    c.i("is_test", 1)
    c.attr("consumed_inputs", None)
    if c.i("training_mode", 0) or any(c.wants(i) for i in range(1, 5)):
        c.unsupported("BatchNormalization in training mode (ember runs inference)")
    return c.call(E.batch_norm, x, mean, var, scale, bias, eps=eps)


@onnx_op("InstanceNormalization", since=6)
def instance_norm(c, x, scale, bias):
    return c.call(F.instance_norm, x, scale, bias, c.f("epsilon", 1e-5))


@onnx_op("GroupNormalization", since=18)
def group_norm(c, x, scale, bias):
    g = c.i("num_groups")
    eps = c.f("epsilon", 1e-5)
    c.i("stash_type", 1)
    ch = x.shape[1]
    if c.opset < 21 and scale.shape == (g,) and g != ch:
        # opset 18 scales per group: repeat each group's value over its channels
        rep = [i for i in range(g) for _ in range(ch // g)]
        idx = E.tensor(rep, dtype=_dt.int64, device="python")
        scale = c.call(E.take, scale, idx, axis=0)
        bias = c.call(E.take, bias, idx, axis=0)
    return c.call(F.group_norm, x, scale, bias, g, eps)


# LayerNormalization is ONNX from opset 17; onnxruntime's fusions write it into older graphs too
@onnx_op("LayerNormalization", since=1)
def layer_norm(c, x, scale, bias=None):
    axis = c.i("axis", -1)
    eps = c.f("epsilon", 1e-5)
    stash = c.i("stash_type", 1)
    if stash != 1:
        c.unsupported(f"stash_type={stash}")
    c.check(x.ndim >= 1 and -x.ndim <= axis < x.ndim, f"axis {axis} is out of range for rank {x.ndim}")
    ax = axis % x.ndim
    ns = tuple(x.shape[ax:])
    if 0 in ns:     # nothing to normalize: the (empty) output is the input's shape
        c.check(not (c.wants(1) or c.wants(2)), f"mean / inv_std_dev over zero elements (input shape {x.shape}, "
                f"axis {axis})")
        return x
    if c.wants(1) or c.wants(2):
        return c.call(F.layer_norm, x, scale, bias, axis, eps, True)
    if tuple(scale.shape) == ns and (bias is None or tuple(bias.shape) == ns):
        return c.call(E.layer_norm, x, ns, scale, bias, eps=eps)
    return c.call(F.layer_norm, x, scale, bias, axis, eps)


@onnx_op("RMSNormalization", since=23)
def rms_norm(c, x, scale):
    axis = c.i("axis", -1)
    eps = c.f("epsilon", 1e-5)
    c.i("stash_type", 1)
    ax = axis % x.ndim
    axes = tuple(range(ax, x.ndim))
    ms = c.call(E.mean, c.call(E.multiply, x, x), axis=axes, keepdims=True)
    return c.call(E.multiply, c.call(E.divide, x, c.call(E.sqrt, c.call(E.add, ms, eps))), scale)


@onnx_op("MeanVarianceNormalization", since=9)
def mvn(c, x):
    axes = tuple(c.ints_attr("axes", [0, 2, 3]))
    m = c.call(E.mean, x, axis=axes, keepdims=True)
    d = c.call(E.subtract, x, m)
    v = c.call(E.mean, c.call(E.multiply, d, d), axis=axes, keepdims=True)
    return c.call(E.divide, d, c.call(E.add, c.call(E.sqrt, v), 1e-9))


@onnx_op("LRN")
def lrn(c, x):
    return c.call(F.lrn, x, c.i("size"), c.f("alpha", 1e-4), c.f("beta", 0.75), c.f("bias", 1.0))


@onnx_op("LpNormalization")
def lp_norm(c, x):
    p = c.i("p", 2)
    if p not in (1, 2):
        c.unsupported(f"p={p}")
    return c.call(F.lp_normalization, x, c.i("axis", -1), p)


def _softmax(name, fn):
    @onnx_op(name, since=1)
    def legacy(c, x):
        axis = c.i("axis", 1)
        if axis % max(x.ndim, 1) == x.ndim - 1:
            return c.call(fn, x, -1) if fn is not F.hardmax else c.call(fn, x, -1)
        return c.call(F.softmax_2d, fn, x, axis)

    @onnx_op(name, since=13)
    def modern(c, x):
        return c.call(fn, x, c.i("axis", -1))


_softmax("Softmax", E.softmax)
_softmax("LogSoftmax", E.log_softmax)
_softmax("Hardmax", F.hardmax)


# ---- reductions ---------------------------------------------------------------------------------

_DIRECT = {"Mean": E.mean, "Max": E.max, "Min": E.min}


def _reduce(kind, axes_input_since):
    name = "Reduce" + kind

    @onnx_op(name, since=1)
    def attr_axes(c, x):
        return _do_reduce(c, kind, x, c.ints_attr("axes", None), False)

    @onnx_op(name, since=axes_input_since)
    def input_axes(c, x, axes=None):
        return _do_reduce(c, kind, x, c.ints(axes, "axes"), bool(c.i("noop_with_empty_axes", 0)))


def _do_reduce(c, kind, x, axes, noop):
    keep = bool(c.i("keepdims", 1))
    if axes is not None and len(axes) == 0:
        axes = None
        if noop:
            return x
    if kind in _DIRECT and x.size > 0:
        kw = {"keepdims": True} if keep else {}
        if axes is not None:
            kw["axis"] = tuple(axes)
        if kind == "Mean" and x.dtype.kind != "f":
            return c.call(F.reduce, kind, x, axes, keep)
        return c.call(_DIRECT[kind], x, **kw)
    if kind == "Sum" and x.dtype.kind == "f":
        kw = {"keepdims": True} if keep else {}
        if axes is not None:
            kw["axis"] = tuple(axes)
        return c.call(E.sum, x, **kw)
    return c.call(F.reduce, kind, x, axes, keep)


for _kind in ("Mean", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare"):
    _reduce(_kind, 18)
_reduce("Sum", 13)


def _arg(name):
    @onnx_op(name)
    def h(c, x):
        axis, keep, last = c.i("axis", 0), bool(c.i("keepdims", 1)), c.i("select_last_index", 0)
        if not last:
            kw = {"keepdims": True} if keep else {}
            return c.call(E.argmax if name == "ArgMax" else E.argmin, x, axis=axis, **kw)
        return c.call(F.arg_reduce, name, x, axis, keep, True)
    return h


_arg("ArgMax")
_arg("ArgMin")


@onnx_op("TopK", since=1)
def topk_v1(c, x):
    return c.call(E.topk, x, c.i("k"), axis=c.i("axis", -1))


@onnx_op("TopK", since=10)
def topk(c, x, k):
    kk = int(c.scalar(k, "k"))
    axis = c.i("axis", -1)
    largest = bool(c.i("largest", 1))
    c.i("sorted", 1)
    kw = {"axis": axis}
    if not largest:
        kw["largest"] = False
    return c.call(E.topk, x, kk, **kw)


@onnx_op("CumSum", since=11)
def cumsum(c, x, axis):
    a = int(c.scalar(axis, "axis"))
    ex, rev = bool(c.i("exclusive", 0)), bool(c.i("reverse", 0))
    return c.call(F.cumsum, x, a, ex, rev)


@onnx_op("NonZero", since=9)
def nonzero(c, x):
    return c.call(F.nonzero, x)


# ---- resize ---------------------------------------------------------------------------------

@onnx_op("Upsample", since=7)
def upsample_v7(c, x):
    return _upsample(c, x, c.floats_attr("scales"))


@onnx_op("Upsample", since=9)
def upsample(c, x, scales):
    return _upsample(c, x, c.floats(scales, "scales"))


def _upsample(c, x, sc):
    mode = c.s("mode", "nearest")
    c.check(len(sc) == x.ndim, f"scales {sc} must have one entry per axis of {x.shape}")
    out = [int(math.floor(n * s)) for n, s in zip(x.shape, sc)]
    if mode not in ("nearest", "linear", "bilinear"):
        c.unsupported(f"mode={mode!r}")
    return c.call(F.resize, x, out, sc, "linear" if mode == "bilinear" else mode, "asymmetric", "floor")


@onnx_op("Resize", since=10)
def resize_v10(c, x, scales):
    mode = c.s("mode", "nearest")
    sc = c.floats(scales, "scales")
    out = [int(math.floor(n * s)) for n, s in zip(x.shape, sc)]
    return c.call(F.resize, x, out, sc, mode, "asymmetric", "floor")


@onnx_op("Resize", since=11)
def resize(c, x, roi=None, scales=None, sizes=None):
    mode = c.s("mode", "nearest")
    coord = c.s("coordinate_transformation_mode", "half_pixel")
    nearest = c.s("nearest_mode", "round_prefer_floor")
    cubic_a = c.f("cubic_coeff_a", -0.75)
    exclude = bool(c.i("exclude_outside", 0))
    extrap = c.f("extrapolation_value", 0.0)
    antialias = False
    if c.opset >= 18:
        antialias = bool(c.i("antialias", 0))
        if antialias and mode == "nearest":
            c.unsupported("antialias=1 with mode='nearest'")
        axes = c.ints_attr("axes", None)
        policy = c.s("keep_aspect_ratio_policy", "stretch")
    else:
        axes, policy = None, "stretch"
    if mode not in ("nearest", "linear", "cubic"):
        c.unsupported(f"mode={mode!r}")
    nd = x.ndim
    axes = list(range(nd)) if axes is None else [a % nd for a in axes]
    sc = c.floats(scales, "scales")
    sz = c.ints(sizes, "sizes")
    if sc is not None and len(sc) == 0:
        sc = None
    if sz is not None and len(sz) == 0:
        sz = None
    full_scales = [1.0] * nd
    out = list(x.shape)
    if sz is not None:
        c.check(sc is None, "give scales or sizes, not both")
        c.check(len(sz) == len(axes), f"sizes {sz} do not match axes {axes}")
        if policy != "stretch":
            ratios = [sz[j] / x.shape[a] for j, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                full_scales[a] = r
                out[a] = int(math.floor(r * x.shape[a] + 0.5))
        else:
            for j, a in enumerate(axes):
                out[a] = sz[j]
                full_scales[a] = sz[j] / x.shape[a] if x.shape[a] else 1.0
    else:
        c.check(sc is not None, "needs scales or sizes")
        c.check(len(sc) == len(axes), f"scales {sc} do not match axes {axes}")
        for j, a in enumerate(axes):
            full_scales[a] = sc[j]
            out[a] = int(math.floor(x.shape[a] * sc[j]))
    roi_full = None
    if coord == "tf_crop_and_resize":
        r = c.floats(roi, "roi")
        c.check(r is not None and len(r) == 2 * len(axes), f"roi {r} must hold starts and ends for axes {axes}")
        roi_full = [0.0] * nd + [1.0] * nd
        for j, a in enumerate(axes):
            roi_full[a] = r[j]
            roi_full[a + nd] = r[j + len(axes)]
    if antialias:
        return c.call(F.resize, x, out, full_scales, mode, coord, nearest, cubic_a, exclude, extrap, roi_full, True)
    return c.call(F.resize, x, out, full_scales, mode, coord, nearest, cubic_a, exclude, extrap, roi_full)


# ---- attention (opset 23) ---------------------------------------------------------------------

@onnx_op("Attention", since=23)
def attention(c, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None):
    causal = bool(c.i("is_causal", 0))
    scale = c.f("scale", None)
    softcap = c.f("softcap", 0.0)
    mode = c.i("qk_matmul_output_mode", 0)
    c.i("softmax_precision", 0)
    window = (c.i("left_window_size", -1), c.i("right_window_size", -1))
    qh, kvh = c.i("q_num_heads", 0), c.i("kv_num_heads", 0)
    c.check((past_key is None) == (past_value is None), "past_key and past_value go together")
    c.check(not (nonpad is not None and past_key is not None), "nonpad_kv_seqlen with a past cache")
    if q.ndim == 3:
        c.check(qh > 0 and kvh > 0, "3-D inputs need q_num_heads and kv_num_heads")
    kw = {"is_causal": causal} if causal else {}
    if scale is not None:
        kw["scale"] = scale
    if q.ndim == 3:
        kw.update(q_heads=qh, kv_heads=kvh)
    if softcap:
        kw["softcap"] = softcap
    if c.wants(3):
        kw["qk_output"] = mode
    if window != (-1, -1):
        kw["window"] = window
    out = c.call(F.attention, q, k, v, mask, past_key, past_value, nonpad, **kw)
    return out


@onnx_op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(c, x, target, weight=None):
    red = c.s("reduction", "mean")
    if red not in ("none", "sum", "mean"):
        c.unsupported(f"reduction={red!r}")
    return c.call(F.nll_loss, x, target, weight, red, c.i("ignore_index", None))


@onnx_op("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy(c, x, labels, weight=None):
    red = c.s("reduction", "mean")
    if red not in ("none", "sum", "mean"):
        c.unsupported(f"reduction={red!r}")
    out = c.call(F.softmax_cross_entropy, x, labels, weight, red, c.i("ignore_index", None))
    return out


@onnx_op("LpPool", since=11)
def lp_pool(c, x):
    k, s, d, p = _spatial(c, x, pool=True)
    if d != [1] * len(d):
        c.unsupported(f"dilations={d} for LpPool")
    return c.call(F.lp_pool, x, c.i("p", 2), tuple(k), tuple(s), tuple(p), bool(c.i("ceil_mode", 0)))


@onnx_op("CenterCropPad", since=18)
def center_crop_pad(c, x, shape):
    axes = c.ints_attr("axes", None)
    return c.call(F.center_crop_pad, x, c.ints(shape, "shape"), axes)


@onnx_op("Compress", since=9)
def compress(c, x, cond):
    return c.call(F.compress, x, cond, c.i("axis", None))


@onnx_op("ReverseSequence", since=10)
def reverse_sequence(c, x, lengths):
    return c.call(F.reverse_sequence, x, lengths, c.i("batch_axis", 1), c.i("time_axis", 0))


@onnx_op("RotaryEmbedding", since=23)
def rotary_embedding(c, x, cos, sin, position_ids=None):
    return c.call(F.rotary_embedding, x, cos, sin, position_ids, interleaved=bool(c.i("interleaved", 0)),
                  num_heads=c.i("num_heads", 0), rotary_dim=c.i("rotary_embedding_dim", 0))


@onnx_op("Scatter", since=9)
def scatter_v9(c, x, indices, updates):
    return c.call(F.scatter_elements, x, indices, updates, c.i("axis", 0), F.int_list)


@onnx_op("Atan", since=7)
def atan(c, x):
    return c.call(F.atan, x)


@onnx_op("Asin", since=7)
def asin(c, x):
    return c.call(F.asin, x)


@onnx_op("Acos", since=7)
def acos(c, x):
    return c.call(F.acos, x)


@onnx_op("Unique", since=11)
def unique(c, x):
    return c.call(F.unique, x, c.i("axis", None), bool(c.i("sorted", 1)))


@onnx_op("GridSample", since=16)
def grid_sample(c, x, grid):
    mode = c.s("mode", "bilinear" if c.opset < 20 else "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad = c.s("padding_mode", "zeros")
    if mode not in ("linear", "nearest", "cubic"):
        c.unsupported(f"mode={mode!r}")
    if pad not in ("zeros", "border", "reflection"):
        c.unsupported(f"padding_mode={pad!r}")
    if mode == "cubic" and x.ndim != 4:
        c.unsupported("cubic GridSample on a non-2-D input")
    return c.call(F.grid_sample, x, grid, mode, pad, bool(c.i("align_corners", 0)))


def _recurrent(kind, n_acts, defaults):
    @onnx_op(kind, since=7)
    def h(c, x, w, r, b=None, seq_lens=None, h0=None, c0=None, peep=None):
        hidden = c.i("hidden_size", None)
        if hidden is None:
            hidden = r.shape[-1]
        direction = c.s("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            c.unsupported(f"direction={direction!r}")
        ndir = 2 if direction == "bidirectional" else 1
        names = c.attr("activations", None) or defaults * ndir
        alphas = c.floats_attr("activation_alpha", None) or []
        betas = c.floats_attr("activation_beta", None) or []
        c.check(len(names) == n_acts * ndir, f"{len(names)} activations for {ndir} direction(s)")
        # alpha/beta lists cover only the activations that take them, in order
        acts, ia, ib = [], 0, 0
        for nm in names:
            takes_a = nm.lower() in ("leakyrelu", "thresholdedrelu", "hardsigmoid", "elu", "affine", "scaledtanh")
            takes_b = nm.lower() in ("hardsigmoid", "affine", "scaledtanh")
            a = alphas[ia] if takes_a and ia < len(alphas) else None
            bb = betas[ib] if takes_b and ib < len(betas) else None
            ia += takes_a
            ib += takes_b
            acts.append(F._act(nm, a, bb))
        kw = {}
        if kind == "GRU":
            kw["linear_before_reset"] = bool(c.i("linear_before_reset", 0))
        if kind == "LSTM":
            kw["input_forget"] = bool(c.i("input_forget", 0))
        layout = c.i("layout", 0)
        clip = c.f("clip", None)
        return c.call(F.rnn, kind, x, w, r, b, seq_lens, h0, c0, peep, hidden=hidden, direction=direction,
                      activations=tuple(acts), clip=clip, layout=layout, **kw)
    return h


_recurrent("RNN", 1, ["Tanh"])
_recurrent("GRU", 2, ["Sigmoid", "Tanh"])
_recurrent("LSTM", 3, ["Sigmoid", "Tanh", "Tanh"])


# ---- control flow: subgraphs run through the same table -----------------------------------------

def _graph_attr(c, name):
    from .proto import Graph
    g = c.attr(name)
    c.check(isinstance(g, Graph), f"attribute {name!r} must be a graph")
    return g


@onnx_op("If", since=1)
def if_(c, cond):
    then_g, else_g = _graph_attr(c, "then_branch"), _graph_attr(c, "else_branch")
    take = bool(c.scalar(cond, "cond"))
    return c.run_graph(then_g if take else else_g, {})


_TRACE_LOOP_LIMIT = 1000   # while loading, longer loops are left to run time (also: ember.onnx.budget)


def _graph_reads(g) -> set:
    """The value names graph ``g`` reads anywhere (its nodes, nested subgraphs, its outputs)."""
    from .runtime import _subgraph_reads
    out = {o.name for o in g.outputs}
    for n in g.nodes:
        out.update(n.inputs)
    return out | _subgraph_reads(g)


@onnx_op("Loop", since=1)
def loop(c, max_trip=None, cond=None, *carried):
    from .runtime import NeedsData
    body = _graph_attr(c, "body")
    n_carried = len(carried)
    c.check(len(body.inputs) == 2 + n_carried, f"the body takes {len(body.inputs)} inputs for {n_carried} "
            f"loop-carried values (+ iteration number and condition)")
    n_scan = len(body.outputs) - 1 - n_carried
    c.check(n_scan >= 0, "the body has too few outputs")
    m = None if max_trip is None else int(c.scalar(max_trip, "M"))
    keep = True if cond is None else bool(c.scalar(cond, "cond"))
    if c.tracing and (m is None or m > _TRACE_LOOP_LIMIT or not c.iterations(max(m, 0), body=body)):
        raise NeedsData("loop trip count")
    values = list(carried)
    scans = [[] for _ in range(n_scan)]
    i = 0
    names = [vi.name for vi in body.inputs]
    cnd = c.call(E.tensor, True, dtype=_dt.bool_, device="python")   # the body only runs while it is true
    reads = _graph_reads(body)
    it = None
    while keep and (m is None or i < m):
        if not c.tracing:
            c.iterations(1, body=body)    # the call's budget, shared by nested loops: OnnxError past it
        if it is None or names[0] in reads:     # (a body that ignores the count gets one tensor)
            it = c.call(E.tensor, i, dtype=_dt.int64, device="python")
        outs = c.run_graph(body, dict(zip(names, [it, cnd] + values)))
        keep = bool(c.scalar(outs[0], "cond")) if body.outputs[0].name else keep
        values = list(outs[1:1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        i += 1
        if c.tracing and i > _TRACE_LOOP_LIMIT:
            raise NeedsData("loop length")
    stacked = []
    for k, items in enumerate(scans):
        if items:
            stacked.append(c.call(E.stack, items, axis=0))
        else:
            c.unsupported("a Loop with scan outputs that runs zero iterations")
    return tuple(values) + tuple(stacked)


@onnx_op("Scan", since=9)
def scan(c, *inputs):
    body = _graph_attr(c, "body")
    n_scan = c.i("num_scan_inputs")
    n_state = len(inputs) - n_scan
    c.check(n_state >= 0, f"num_scan_inputs={n_scan} exceeds the {len(inputs)} inputs")
    in_axes = c.ints_attr("scan_input_axes", None) or [0] * n_scan
    in_dirs = c.ints_attr("scan_input_directions", None) or [0] * n_scan
    n_out = len(body.outputs) - n_state
    out_axes = c.ints_attr("scan_output_axes", None) or [0] * n_out
    out_dirs = c.ints_attr("scan_output_directions", None) or [0] * n_out
    c.check(n_scan >= 1, f"num_scan_inputs must be >= 1, got {n_scan}")
    states = list(inputs[:n_state])
    xs = inputs[n_state:]
    c.check(all(x is not None for x in inputs), "an input is missing (an empty name)")
    c.check(len(in_axes) == n_scan and len(in_dirs) == n_scan,
            f"scan_input_axes/directions give {len(in_axes)}/{len(in_dirs)} values for {n_scan} scan inputs")
    c.check(len(out_axes) >= n_out and len(out_dirs) >= n_out and n_out >= 0,
            f"scan_output_axes/directions give {len(out_axes)}/{len(out_dirs)} values for {n_out} scan outputs")
    c.check(len(body.inputs) == len(inputs), f"the body takes {len(body.inputs)} inputs, the node gives {len(inputs)}")
    c.check(all(x.ndim >= 1 and -x.ndim <= a < x.ndim for x, a in zip(xs, in_axes)),
            f"scan_input_axes {in_axes} out of range for inputs of shapes {[x.shape for x in xs]}")
    axes = [a % xs[k].ndim for k, a in enumerate(in_axes)]
    length = xs[0].shape[axes[0]] if xs else 0
    c.check(all(x.shape[a] == length for x, a in zip(xs, axes)), "scan inputs differ in length")
    # One budget for all loops of a load / a call: a 10**12 axis (even of a zero-size tensor)
    # is left to run time while loading, and refused when called.
    if not c.iterations(length, "iterations (a Scan over an axis this long)", body=body):
        from .runtime import NeedsData
        raise NeedsData("scan length")
    outs_seq = [[] for _ in range(n_out)]
    names = [vi.name for vi in body.inputs]
    for t in range(length):
        slices = []
        for k, x in enumerate(xs):
            pos = length - 1 - t if in_dirs[k] else t
            key = (slice(None),) * axes[k] + (pos,)
            slices.append(c.call(operator.getitem, x, key))
        outs = c.run_graph(body, dict(zip(names, states + slices)))
        states = list(outs[:n_state])
        for k in range(n_out):
            outs_seq[k].append(outs[n_state + k])
    stacked = []
    for k, items in enumerate(outs_seq):
        if out_dirs[k]:
            items = items[::-1]
        c.check(bool(items), "Scan over zero steps with scan outputs")
        axis = out_axes[k] % (items[0].ndim + 1)
        stacked.append(c.call(E.stack, items, axis=axis))
    return tuple(states) + tuple(stacked)


@onnx_op("CumProd", since=26)
def cumprod(c, x, axis):
    a = int(c.scalar(axis, "axis"))
    return c.call(F.cumprod, x, a, bool(c.i("exclusive", 0)), bool(c.i("reverse", 0)))


@onnx_op("AffineGrid", since=20)
def affine_grid(c, theta, size):
    return c.call(F.affine_grid, theta, c.ints(size, "size"), bool(c.i("align_corners", 0)))


# ---- quantization (ember.onnx.quant: int8/int16/uint16 held as int32, ranges from zero points) ----

_QTYPES = {proto.UINT8: (0, 255), proto.INT8: (-128, 127), proto.UINT16: (0, 65535), proto.INT16: (-32768, 32767)}


def _zp_check(c, zp, what):
    if zp is not None and zp.dtype not in (_dt.uint8, _dt.int32):
        c.unsupported(f"{what} of dtype {zp.dtype.name} (ember quantizes to uint8, int8, uint16 and int16)")


def _blocks(c):
    """The block_size attribute (opset 21 on), as keywords for F.quantize/dequantize_linear."""
    b = c.i("block_size", 0) if c.opset >= 21 else 0
    if b < 0:
        c.check(False, f"block_size must be >= 0, got {b}")
    return {"block_size": b} if b else {}


@onnx_op("QuantizeLinear", since=10)
def quantize_linear(c, x, scale, zp=None):
    axis = c.i("axis", 1) if c.opset >= 13 else 1
    if c.opset >= 19:
        c.i("saturate", 1)              # matters for float8 targets only
    blk = _blocks(c)
    _zp_check(c, zp, "y_zero_point")
    if zp is None:
        code = c.i("output_dtype", 0) if c.opset >= 21 else 0
        if code and code not in _QTYPES:
            c.unsupported(f"output_dtype {proto.DTYPE_NAMES.get(code, code)}")
        lo, hi = _QTYPES.get(code, _QTYPES[proto.UINT8])
    else:
        if c.opset >= 21:
            c.i("output_dtype", 0)
        from .quant import narrow_range
        lo, hi = narrow_range(zp)
    return c.call(F.quantize_linear, x, scale, zp, axis, lo, hi, **blk)


@onnx_op("DequantizeLinear", since=10)
def dequantize_linear(c, x, scale, zp=None):
    axis = c.i("axis", 1) if c.opset >= 13 else 1
    blk = _blocks(c)
    if c.opset >= 23:
        c.i("output_dtype", 0)
    _zp_check(c, zp, "x_zero_point")
    y = c.call(F.dequantize_linear, x, scale, zp, axis, **blk)
    return c.call(E.astype, y, scale.dtype) if scale.dtype is _dt.float16 else y


@onnx_op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(c, x):
    return c.call(F.dynamic_quantize_linear, x)


@onnx_op("MatMulInteger", since=10)
def matmul_integer(c, a, b, a_zp=None, b_zp=None):
    return c.call(F.matmul_integer, a, b, a_zp, b_zp)


@onnx_op("ConvInteger", since=10)
def conv_integer(c, x, w, x_zp=None, w_zp=None):
    return c.call(F.conv_integer, x, w, x_zp, w_zp, **_conv_kw(c, x, w))


@onnx_op("QLinearMatMul", since=10)
def qlinear_matmul(c, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
    for zp, what in ((a_zp, "a_zero_point"), (b_zp, "b_zero_point"), (y_zp, "y_zero_point")):
        _zp_check(c, zp, what)
    return c.call(F.qlinear_matmul, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)


@onnx_op("QLinearConv", since=10)
def qlinear_conv(c, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
    for zp, what in ((x_zp, "x_zero_point"), (w_zp, "w_zero_point"), (y_zp, "y_zero_point")):
        _zp_check(c, zp, what)
    return c.call(F.qlinear_conv, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias, **_conv_kw(c, x, w))


# onnxruntime's QOperator-format contrib ops (quantize_static(..., quant_format=QOperator))

@onnx_op("QuantizeLinear", domain=MS)
def ms_quantize_linear(c, x, scale, zp=None):
    from .quant import narrow_range
    _zp_check(c, zp, "y_zero_point")
    lo, hi = narrow_range(zp)
    return c.call(F.quantize_linear, x, scale, zp, c.i("axis", 1), lo, hi)


@onnx_op("DequantizeLinear", domain=MS)
def ms_dequantize_linear(c, x, scale, zp=None):
    return c.call(F.dequantize_linear, x, scale, zp, c.i("axis", 1))


@onnx_op("QGemm", domain=MS)
def qgemm(c, a, a_scale, a_zp, b, b_scale, b_zp, bias=None, y_scale=None, y_zp=None):
    alpha = c.f("alpha", 1.0)
    ta, tb = bool(c.i("transA", 0)), bool(c.i("transB", 0))
    c.check(a.ndim == 2 and b.ndim == 2, f"A and B must be 2-D, got {a.shape} and {b.shape}")
    return c.call(F.qgemm, a, a_scale, a_zp, b, b_scale, b_zp, bias, y_scale, y_zp, alpha, ta, tb)


def _qlinear_binary(name, kind):
    @onnx_op(name, domain=MS)
    def h(c, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp=None):
        return c.call(F.qlinear_binary, kind, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp)
    return h


_qlinear_binary("QLinearAdd", "add")
_qlinear_binary("QLinearMul", "mul")


def _qlinear_unary(name, fn):
    """Dequantize, ``fn``, quantize (onnxruntime computes these through a lookup table of the
    same float function)."""
    @onnx_op(name, domain=MS)
    def h(c, x, x_scale, x_zp, y_scale, y_zp=None):
        y = fn(c, c.call(F.dequantize_linear, x, x_scale, x_zp))
        return c.call(F.quantize_linear, y, y_scale, y_zp)
    return h


_qlinear_unary("QLinearSigmoid", lambda c, x: c.call(E.sigmoid, x))
_qlinear_unary("QLinearLeakyRelu", lambda c, x: c.call(E.leaky_relu, x, c.f("alpha", 0.01)))


@onnx_op("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_avg_pool(c, x, x_scale, x_zp, y_scale, y_zp=None):
    if c.i("channels_last", 0):
        c.unsupported("channels_last=1")
    y = c.call(E.mean, c.call(F.dequantize_linear, x, x_scale, x_zp), axis=tuple(range(2, x.ndim)), keepdims=True)
    return c.call(F.quantize_linear, y, y_scale, y_zp)


@onnx_op("QLinearConcat", domain=MS)
def qlinear_concat(c, y_scale, y_zp, *xs):
    c.check(len(xs) % 3 == 0 and xs, "inputs must be (Y_scale, Y_zero_point) then (X, X_scale, X_zero_point) triples")
    parts = [c.call(F.dequantize_linear, xs[i], xs[i + 1], xs[i + 2]) for i in range(0, len(xs), 3)]
    return c.call(F.quantize_linear, c.call(E.concat, parts, axis=c.i("axis")), y_scale, y_zp)


# ---- onnxruntime's fused transformer ops (ember.onnx.contrib) ----------------------------------

@onnx_op("SkipLayerNormalization", domain=MS)
def skip_layer_norm(c, x, skip, gamma, beta=None, bias=None):
    if c.wants(1) or c.wants(2):
        c.unsupported("the mean / inv_std_var outputs of SkipLayerNormalization")
    want_sum = c.wants(3)
    out = c.call(F.skip_layer_norm, x, skip, gamma, beta, bias, c.f("epsilon", 1e-12), want_sum)
    return (out[0], None, None, out[1]) if want_sum else out[0]


@onnx_op("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm(c, x, skip, gamma, bias=None):
    if c.wants(1) or c.wants(2):
        c.unsupported("the mean / inv_std_var outputs of SkipSimplifiedLayerNormalization")
    want_sum = c.wants(3)
    out = c.call(F.skip_simplified_layer_norm, x, skip, gamma, bias, c.f("epsilon", 1e-12), want_sum)
    return (out[0], None, None, out[1]) if want_sum else out[0]


@onnx_op("SimplifiedLayerNormalization", since=1)
def simplified_layer_norm(c, x, scale):
    axis = c.i("axis", -1)
    eps = c.f("epsilon", 1e-5)
    c.i("stash_type", 1)
    if c.wants(1):
        c.unsupported("the inv_std_var output of SimplifiedLayerNormalization")
    axes = tuple(range(axis % x.ndim, x.ndim))
    ms = c.call(E.mean, c.call(E.multiply, x, x), axis=axes, keepdims=True)
    return c.call(E.multiply, c.call(E.divide, x, c.call(E.sqrt, c.call(E.add, ms, eps))), scale)


@onnx_op("EmbedLayerNormalization", domain=MS)
def embed_layer_norm(c, ids, segment_ids, word, pos, seg, gamma, beta, mask=None, position_ids=None):
    eps = c.f("epsilon", 1e-12)
    if c.i("mask_index_type", 1) not in (0, 1):
        c.unsupported(f"mask_index_type={c.i('mask_index_type')}")
    want_sum = c.wants(2)
    out = c.call(F.embed_layer_norm, ids, segment_ids, word, pos, seg, gamma, beta, mask, position_ids, eps,
                 want_sum)
    return out


@onnx_op("Attention", domain=MS)
def ms_attention(c, x, weights, bias=None, mask_index=None, past=None, attention_bias=None, past_len=None):
    heads = c.i("num_heads")
    sizes = c.ints_attr("qkv_hidden_sizes", None)
    uni = bool(c.i("unidirectional", 0))
    scale = c.f("scale", 0.0)
    mfv = c.f("mask_filter_value", -10000.0)
    if c.i("do_rotary", 0):
        c.unsupported("do_rotary=1")
    c.i("rotary_embedding_dim", 0)
    c.i("past_present_share_buffer", 0)
    if past is not None or c.wants(1):
        c.unsupported("a past / present key-value cache")
    c.check(x.ndim == 3, f"input must be (batch, sequence, hidden), got {x.shape}")
    kw = {"num_heads": heads}
    if sizes:
        kw["qkv_hidden_sizes"] = tuple(sizes)
    if uni:
        kw["unidirectional"] = True
    if scale:
        kw["scale"] = scale
    if mfv != -10000.0:
        kw["mask_filter_value"] = mfv
    return c.call(F.ms_attention, x, weights, bias, mask_index, attention_bias, **kw)


@onnx_op("FastGelu", domain=MS)
def fast_gelu(c, x, bias=None):
    return c.call(F.fast_gelu, x, bias)


@onnx_op("BiasGelu", domain=MS)
def bias_gelu(c, x, bias):
    return c.call(F.bias_gelu, x, bias)


@onnx_op("Gelu", domain=MS)
def ms_gelu(c, x):
    return c.call(E.gelu, x)


@onnx_op("QuickGelu", domain=MS)
def quick_gelu(c, x):
    return c.call(F.quick_gelu, x, c.f("alpha", 1.702))


@onnx_op("FusedMatMul", domain=MS)
def fused_matmul(c, a, b):
    if c.i("transBatchA", 0) or c.i("transBatchB", 0):
        c.unsupported("transBatchA / transBatchB")
    return c.call(F.fused_matmul, a, b, c.f("alpha", 1.0), bool(c.i("transA", 0)), bool(c.i("transB", 0)))


@onnx_op("QLinearSoftmax", domain=MS)
def qlinear_softmax(c, x, x_scale, x_zp, y_scale, y_zp=None):
    # the node's own "opset" attribute says which Softmax semantics it follows (2-D coercion before 13)
    axis = c.i("axis", -1)
    legacy = c.i("opset", 13) < 13
    v = c.call(F.dequantize_linear, x, x_scale, x_zp)
    y = c.call(F.softmax_2d, E.softmax, v, axis) if legacy else c.call(E.softmax, v, axis)
    return c.call(F.quantize_linear, y, y_scale, y_zp)


# ---- nodes written by ember's load-time rewrites (ember.onnx.fuse) ------------------------------

@onnx_op("Linear", domain=EMBER)
def ember_linear(c, x, w, b=None):
    """MatMul(x, W) + b with W (in, out) constant: ``linear(x, W.T, b)``, W.T folded once. With
    a ``split`` attribute (``fuse_parallel_linears``: several such products of one x, their
    weights side by side) the output is split back along its last axis into those pieces."""
    y = c.call(E.linear, x, c.call(E.permute_dims, w, (1, 0)), b)
    sizes = c.ints_attr("split", None)
    return y if sizes is None else c.call(F.split, y, list(sizes), -1)


@onnx_op("Attention", domain=EMBER)
def ember_attention(c, q, kt, v, mask=None, scale=None):
    """``MatMul(softmax(MatMul(q, kt) [Div|Mul scale] [+ mask]), v)`` (``fuse_attention``; the
    attribute ``scale_op`` names the scaling op) as ``scaled_dot_product_attention(q, kt^T, v,
    mask, scale)`` where the operands are float32 or float64 of one dtype with at least two axes,
    the mask (if any) is of that dtype and broadcasts to the scores and the scale is one number;
    otherwise the original ops, in order."""
    from ..registry import broadcast_shapes
    op_ = c.s("scale_op", "")
    fits = q.dtype is kt.dtype is v.dtype and q.dtype in (_dt.float32, _dt.float64) \
        and min(q.ndim, kt.ndim, v.ndim) >= 2 and q.shape[-1] == kt.shape[-2] and kt.shape[-1] == v.shape[-2] \
        and (scale is None or scale.size == 1)
    if fits:
        try:
            batch = broadcast_shapes(tuple(q.shape[:-2]), tuple(kt.shape[:-2]), tuple(v.shape[:-2]))
            scores = tuple(batch) + (q.shape[-2], kt.shape[-1])
            fits = mask is None or (mask.dtype is q.dtype and mask.ndim <= len(scores)
                                    and tuple(broadcast_shapes(tuple(mask.shape), scores)) == scores)
        except ShapeError:
            fits = False
    if fits:
        sv = 1.0 if scale is None else float(c.scalar(scale, "the scale"))
        if op_ == "Div" and sv != 0.0:
            sv = 1.0 / sv
        if sv != 0.0 or op_ != "Div":
            return c.call(E.scaled_dot_product_attention, q, c.call(E.matrix_transpose, kt), v, mask, False, sv)
    s = c.call(E.matmul, q, kt)
    if op_ in ("Div", "Mul"):
        s = c.call(E.divide if op_ == "Div" else E.multiply, s, scale)
    if mask is not None:
        s = c.call(E.add, s, mask)
    return c.call(E.matmul, c.call(E.softmax, s, -1), v)
