"""The one op registry.

Every op is declared once with ``op(...)``: its name, its shape rule and its dtype rule, and,
for composite ops, a default decomposition into other ops (like Burn's default trait methods).
``apply(name, *tensors, **attrs)`` checks devices, runs the shape and dtype rules, then calls the
backend's kernel for the op when it has one, else the decomposition. A backend may therefore
override any composite (softmax, gelu, layer_norm, attention...) with a faster kernel, and needs
to implement only the primitives.

Kernel calling convention (the backend protocol, see ``ember.backends``)::

    kernel(out, *inputs, **attrs) -> buffer          # out is a Meta(shape, dtype)
    kernel(outs, *inputs, **attrs) -> tuple[buffer]  # ops declared with outputs=N > 1

``inputs`` are Tensors of the kernel's backend (``t._buf``, ``t.shape``, ``t.dtype``).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

from . import dtypes as _dt
from .errors import DeviceError, ShapeError, UnsupportedOp
from .limits import check_output as _limit


class Meta(NamedTuple):
    """Shape and dtype of an op output, computed by the op's rules before the kernel runs."""

    shape: tuple
    dtype: _dt.DType


class OpDef:
    """One registry entry. ``shape(*in_shapes, **attrs)`` and ``dtype(*in_dtypes, **attrs)``
    return the output shape/dtype (tuples of them when ``outputs > 1``) and raise ShapeError /
    DTypeError naming the op. ``decompose(*tensors, **attrs)`` (composites only) builds the
    result from other ops. ``grad(g, y, *inputs, need=..., **attrs)`` (see ``ember.autograd``)
    returns the gradients of the inputs from the output gradient ``g``; without one, a
    composite is differentiated through its decomposition and a primitive is not
    differentiable."""

    __slots__ = ("name", "kind", "shape", "dtype", "decompose", "outputs", "doc", "grad")

    def __init__(self, name, kind, shape, dtype, decompose, outputs, doc, grad=None):
        self.name = name
        self.grad = grad
        self.kind = kind
        self.shape = shape
        self.dtype = dtype
        self.decompose = decompose
        self.outputs = outputs
        self.doc = doc

    def __repr__(self) -> str:
        return f"<op {self.name} ({self.kind})>"


OPS: dict[str, OpDef] = {}

# [Capture or None]: the execution plan being recorded (ember.plan). apply() appends every
# kernel call to it; the check costs one list index per op when nothing is recorded.
CAPTURE: list = [None]

# [bool]: True while gradients may be recorded (grad mode on, and some tensor has required
# grad); then apply() hands any op with an input that requires grad to GRAD_HOOK[0]
# (ember.autograd.record). Inference pays this one list index per op.
GRAD: list = [False]
GRAD_HOOK: list = [None]

# A kernel may return DECOMPOSE instead of a buffer: apply then runs the op's decomposition (the
# router device does so when its members' primitives beat the one member's fused kernel).
DECOMPOSE = object()

# kinds: 'unary' and 'binary' (elementwise, fusable), 'ternary' (where), 'reduce', 'movement',
# 'create', 'other' (matmul, conv...), 'composite' (has a decomposition)
KINDS = ("unary", "binary", "ternary", "reduce", "movement", "create", "other", "composite")


def op(name: str, *, kind: str, shape: Callable, dtype: Callable, decompose: Callable | None = None,
       outputs: int = 1, doc: str = "", grad: Callable | None = None) -> OpDef:
    """Declare an op (``grad``: its gradient rule, see ``ember.autograd``). Declaring a name
    twice is a bug and raises."""
    if name in OPS:
        raise ValueError(f"op {name!r} declared twice")
    if kind not in KINDS:
        raise ValueError(f"op {name!r}: unknown kind {kind!r}")
    d = OpDef(name, kind, shape, dtype, decompose, outputs, doc, grad)
    OPS[name] = d
    return d


def apply(name: str, *inputs, **attrs):
    """Run op ``name`` on Tensors ``inputs`` (all on one device) and return Tensor(s)."""
    if GRAD[0]:
        for t in inputs:
            if t._ag is not None:
                return GRAD_HOOK[0](OPS[name], inputs, attrs)
    from .tensor import Tensor

    d = OPS[name]
    dev = inputs[0].device if inputs else attrs.pop("device")
    for t in inputs:
        if t.device != dev:
            raise DeviceError(f"{name}: inputs are on different devices ({dev!r} and {t.device!r}); "
                              f"move them with .to(device) first")
    out_shape = d.shape(*[t.shape for t in inputs], **attrs)
    out_dtype = d.dtype(*[t.dtype for t in inputs], **attrs)
    _limit(name, out_shape, out_dtype, dev)
    from .backends import get_backend

    backend = get_backend(dev)
    kernel = backend.kernels.get(name)
    if kernel is None:
        if d.decompose is None:
            raise UnsupportedOp(f"{name}: no kernel on backend {backend.name!r} and no decomposition")
        return d.decompose(*inputs, **attrs)
    if d.outputs == 1:
        meta = Meta(tuple(out_shape), out_dtype)
        buf = kernel(meta, *inputs, **attrs)
        if buf is DECOMPOSE:
            return d.decompose(*inputs, **attrs)
        out = Tensor._wrap(buf, out_shape, out_dtype, dev)
        if CAPTURE[0] is not None:
            CAPTURE[0].record(name, kernel, inputs, meta, attrs, (out,), False)
        return out
    metas = tuple(Meta(tuple(s), t) for s, t in zip(out_shape, out_dtype))
    bufs = kernel(metas, *inputs, **attrs)
    if bufs is DECOMPOSE:
        return d.decompose(*inputs, **attrs)
    outs = tuple(Tensor._wrap(b, m.shape, m.dtype, dev) for b, m in zip(bufs, metas))
    if CAPTURE[0] is not None:
        CAPTURE[0].record(name, kernel, inputs, metas, attrs, outs, True)
    return outs


# ---- shared shape / dtype rules -------------------------------------------------------------

def broadcast_shapes(*shapes, op: str = "broadcast") -> tuple:
    """NumPy broadcasting of shapes; ShapeError names the op and the offending axis."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(-nd, 0):
        size = 1
        for s in shapes:
            if -i <= len(s):
                n = s[i]
                if n != 1:
                    if size != 1 and size != n:
                        shown = " and ".join(str(tuple(x)) for x in shapes)
                        raise ShapeError(f"{op}: shapes {shown} do not broadcast (axis {i}: {size} vs {n})")
                    size = n
        out.append(size)
    return tuple(out)


def normalize_axis(axis: int, ndim: int, op: str) -> int:
    """Map a possibly negative axis into range, ShapeError otherwise."""
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"{op}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axis, ndim: int, op: str) -> tuple:
    """None -> all axes; int or sequence -> sorted tuple of non-negative axes (no repeats)."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = tuple(sorted(normalize_axis(a, ndim, op) for a in axis))
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis}")
    return out


def same_shape(*shapes, **_):
    return shapes[0]


def same_dtype(*dts, **_):
    return dts[0]


def promote(*dts, **_):
    r = dts[0]
    for d in dts[1:]:
        r = _dt.result_type(r, d)
    return r


def to_float(*dts, **_):
    """Float ops (exp, sqrt, divide...) on ints/bools return the default float dtype."""
    r = promote(*dts)
    return r if r.kind == "f" else _dt.default_float


def to_bool(*_, **__):
    return _dt.bool_
