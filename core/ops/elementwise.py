"""Elementwise ops (unary, binary with broadcasting, where, cast) and the Python operators.

dtype rules (declared once per op, below):

- arithmetic (``add subtract multiply floor_divide remainder pow negative sign floor ceil
  round``): any numeric dtype, array-API promotion; bool alone is rejected (cast first).
- float math (``divide exp log sqrt sin cos tanh erf``): floats keep their dtype, ints and
  bools give float32.
- comparisons and ``isnan``: any dtype -> bool. ``maximum minimum abs``: any dtype.
- logical ops (``logical_and/or/xor/not``, ``where``'s condition): bool only.

What kernels see (a promise to every backend): the operands of a binary op, ``where``'s two
values, ``matmul`` and ``concat`` arrive in ONE dtype (the public functions cast mixed inputs
first with the ``cast`` op); float-math unary kernels only get floats; ``sum``/``prod`` get
their accumulation dtype. Only ``cast`` changes a dtype; comparisons, ``isnan`` and the
logical ops write bool; ``argmax``/``argmin`` write int64.

Python scalars are weakly typed (``dtypes.scalar_dtype``): ``x_f16 * 2.0`` stays float16,
``x_int + 1.5`` is float32, and an int scalar that does not fit an int tensor's dtype raises.

>>> import ember
>>> x = ember.tensor([1.0, -2.5, 4.0])
>>> ember.maximum(x, 0).tolist()
[1.0, 0.0, 4.0]
>>> (ember.tensor([7, -7]) // 2).tolist(), (ember.tensor([7, -7]) % 3).tolist()
([3, -4], [1, 2])
"""
from __future__ import annotations

import math

from .. import dtypes as _dt
from ..autograd import keeps_output, sum_to
from ..errors import DTypeError
from ..registry import apply, broadcast_shapes, op, promote, same_shape, to_bool, to_float
from ..tensor import Tensor
from . import method
from .creation import full

__all__ = ["asarray_like", "add", "subtract", "multiply", "divide", "floor_divide", "remainder",
           "pow", "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
           "greater_equal", "logical_and", "logical_or", "logical_xor", "logical_not", "negative",
           "positive", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "erf", "sign",
           "floor", "ceil", "round", "isnan", "isinf", "isfinite", "reciprocal", "square", "where",
           "clip", "astype", "acos", "acosh", "asin", "asinh", "atan", "atanh", "cosh", "sinh", "tan", "expm1",
           "log1p", "log2", "log10", "trunc", "signbit", "atan2", "copysign", "hypot", "logaddexp", "bitwise_and",
           "bitwise_or", "bitwise_xor", "bitwise_invert", "bitwise_left_shift", "bitwise_right_shift", "host_fallback"]

_INT_RANGE = {d.name: _dt.int_range(d) for d in _dt.ALL if d.kind in "iu"}


def asarray_like(x, like: Tensor) -> Tensor:
    """``x`` as a tensor on ``like``'s device. A Python scalar takes a weak dtype next to
    ``like`` (and must fit it); lists and numpy arrays become tensors with their own dtype.

    >>> import ember
    >>> ember.ops.asarray_like(2.0, ember.tensor([1.0], dtype="float16")).dtype
    ember.float16
    """
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        dt = _dt.scalar_dtype(x, like.dtype)
        if dt.kind in "iu" and not isinstance(x, bool):
            lo, hi = _INT_RANGE[dt.name]
            if not lo <= x <= hi:
                raise DTypeError(f"the Python int {x} does not fit {dt.name} (range {lo}..{hi}); "
                                 f"cast the tensor to a wider dtype first")
        return full((), x, dtype=dt, device=like.device)
    if isinstance(x, (list, tuple)) or hasattr(x, "__array_interface__"):
        from ..tensor import tensor

        return tensor(x, device=like.device)
    raise DTypeError(f"cannot combine a tensor with a {type(x).__name__}")


# ---- dtype rules ------------------------------------------------------------------------------

def _names(dts):
    return ", ".join(d.name for d in dts)


def numeric(name):
    """Promote; reject an all-bool input (arithmetic on bools is ambiguous: cast first)."""
    def rule(*dts, **_):
        if all(d is _dt.bool_ for d in dts):
            raise DTypeError(f"{name}: not defined for bool tensors ({_names(dts)}); "
                             f"cast with .astype(ember.int64) first, or use the logical_* ops")
        return promote(*dts)
    return rule


def floating(name):
    """Floats keep their dtype; ints and bools compute in float32."""
    def rule(*dts, **_):
        return to_float(*dts)
    return rule


def boolean(name):
    """Bool inputs only (array-API logical ops)."""
    def rule(*dts, **_):
        bad = [d for d in dts if d is not _dt.bool_]
        if bad:
            raise DTypeError(f"{name}: needs bool tensors, got {_names(dts)}; compare first "
                             f"(x != 0) or cast with .astype(ember.bool)")
        return _dt.bool_
    return rule


def _any(name):
    def rule(*dts, **_):
        return promote(*dts)
    return rule


def _compare(name):
    def rule(*dts, **_):
        promote(*dts)
        return _dt.bool_
    return rule


def integral(name, allow_bool=True):
    """Integers (and bools, for the bitwise and/or/xor/invert) only."""
    kinds = "iub" if allow_bool else "iu"

    def rule(*dts, **_):
        bad = [d for d in dts if d.kind not in kinds]
        if bad:
            raise DTypeError(f"{name}: needs integer{' or bool' if allow_bool else ''} tensors, got {_names(dts)}")
        return promote(*dts)
    return rule


def host_fallback(name):
    """Decomposition for an op that only the CPU backends (python, numpy, wasm's python table)
    implement: run it on device "python" and move the result back. A GPU backend without a
    kernel for it (webgpu: no WGSL yet) then still answers, at the price of two transfers."""
    def decompose(*xs, **attrs):
        dev = xs[0].device if xs else attrs.pop("device")
        ins = [x.to("python") for x in xs]
        out = apply(name, *ins, **attrs) if ins else apply(name, device="python", **attrs)
        if isinstance(out, tuple):
            return tuple(o.to(dev) for o in out)
        return out.to(dev)
    return decompose


# ---- declarations ----------------------------------------------------------------------------

def _to(x: Tensor, dt) -> Tensor:
    return x if x.dtype is dt else apply("cast", x, dtype=dt)


def _public(name, fn, doc):
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return method(fn)


def _unary(name, dtype_rule, doc="", decompose=None, grad=None, cpu_only=False):
    """Declare a unary op (a composite when ``decompose`` is given) and its public function.
    ``cpu_only``: the CPU backends have kernels, other devices run it through ``host_fallback``."""
    if cpu_only:
        decompose = host_fallback(name)
    op(name, kind="composite" if decompose else "unary", shape=same_shape, dtype=dtype_rule(name),
       decompose=decompose, doc=doc, grad=grad)
    float_math = dtype_rule is floating

    def fn(x: Tensor) -> Tensor:
        if float_math and x.dtype.kind != "f":  # kernels of float math only ever see floats
            x = _to(x, _dt.default_float)
        return apply(name, x)
    return _public(name, fn, doc)


def _args(x1, x2):
    if not isinstance(x1, Tensor):
        if not isinstance(x2, Tensor):
            raise DTypeError(f"need at least one Tensor, got {type(x1).__name__} and {type(x2).__name__}")
        x1 = asarray_like(x1, x2)
    return x1, asarray_like(x2, x1)


def _common(x1, x2, dtype_rule):
    """Both operands in the dtype the op computes in, so that every kernel of a binary op sees
    one input dtype (mixed dtypes cost one cast here instead of a kernel variant per pair)."""
    if x1.dtype is x2.dtype and (dtype_rule is not floating or x1.dtype.kind == "f"):
        return x1, x2
    if dtype_rule is boolean:
        return x1, x2  # the rule rejects non-bool inputs
    ct = to_float(x1.dtype, x2.dtype) if dtype_rule is floating else promote(x1.dtype, x2.dtype)
    return _to(x1, ct), _to(x2, ct)


def _binary(name, dtype_rule, doc="", decompose=None, grad=None, cpu_only=False):
    """Declare a broadcasting binary op (a composite when ``decompose`` is given) and its
    public function, which accepts Python scalars on either side. ``grad(g, a, b, need)``
    gives the two gradients at the broadcast shape; they are summed back to each operand's."""
    rule = None
    if grad is not None:
        def rule(g, y, a, b, *, need, **_):
            ga, gb = grad(g, a, b, need)
            return (sum_to(ga, a.shape) if need[0] and ga is not None else None,
                    sum_to(gb, b.shape) if need[1] and gb is not None else None)
    if cpu_only:
        decompose = host_fallback(name)
    op(name, kind="composite" if decompose else "binary", shape=lambda a, b, **_: broadcast_shapes(a, b, op=name),
       dtype=dtype_rule(name), decompose=decompose, doc=doc, grad=rule)

    def fn(x1, x2) -> Tensor:
        x1, x2 = _args(x1, x2)
        return apply(name, *_common(x1, x2, dtype_rule))
    return _public(name, fn, doc)


def _zero(x):
    return full(x.shape, 0.0, dtype=x.dtype, device=x.device)


def _pow_grad(g, a, b, need):
    # PyTorch's conventions: d/da is 0 where b == 0; d/db is 0 where a == 0 and b >= 0.
    ga = gb = None
    if need[0]:
        ga = where(equal(b, 0), 0.0, multiply(g, multiply(b, pow(a, subtract(b, 1)))))
    if need[1]:
        gb = where(logical_and(equal(a, 0), less_equal(0, b)), 0.0, multiply(g, multiply(pow(a, b), log(a))))
    return ga, gb


def _pick_grad(g, a_wins, tie):
    # maximum/minimum: the gradient goes to the winner; ties split it evenly (as PyTorch)
    half = multiply(g, 0.5)
    return where(a_wins, g, where(tie, half, 0.0)), where(a_wins, 0.0, where(tie, half, g))


negative = _unary("negative", numeric, "-x (ints wrap).", grad=lambda g, y, x, **_: negative(g))
abs = _unary("abs", _any, "|x| (abs of the most negative int wraps, like numpy).",
             grad=lambda g, y, x, **_: multiply(g, sign(x)))  # noqa: A001
exp = _unary("exp", floating, "e**x.\n\n>>> import ember\n>>> ember.exp(ember.tensor([0.0])).tolist()\n[1.0]",
             grad=keeps_output(lambda g, y, x, **_: multiply(g, y)))
log = _unary("log", floating, "Natural log; log(0) = -inf, log(<0) = nan.", grad=lambda g, y, x, **_: divide(g, x))
sqrt = _unary("sqrt", floating, "Square root; sqrt(<0) = nan.",
              grad=keeps_output(lambda g, y, x, **_: divide(g, multiply(y, 2.0))))
sin = _unary("sin", floating, "Sine (radians).", grad=lambda g, y, x, **_: multiply(g, cos(x)))
cos = _unary("cos", floating, "Cosine (radians).", grad=lambda g, y, x, **_: negative(multiply(g, sin(x))))
tanh = _unary("tanh", floating, "Hyperbolic tangent.",
              grad=keeps_output(lambda g, y, x, **_: multiply(g, subtract(1.0, multiply(y, y)))))
erf = _unary("erf", floating, "Gauss error function.",
             grad=lambda g, y, x, **_: multiply(g, multiply(exp(negative(multiply(x, x))), 2.0 / math.sqrt(math.pi))))
sign = _unary("sign", numeric, "-1, 0 or 1 (nan stays nan).", grad=lambda g, y, x, **_: _zero(x))
floor = _unary("floor", numeric, "Round toward -inf (ints unchanged).", grad=lambda g, y, x, **_: _zero(x))
ceil = _unary("ceil", numeric, "Round toward +inf (ints unchanged).", grad=lambda g, y, x, **_: _zero(x))
round = _unary("round", numeric, "Round half to even, like numpy (ints unchanged).\n\n"  # noqa: A001
               ">>> import ember\n>>> ember.round(ember.tensor([0.5, 1.5, 2.5])).tolist()\n[0.0, 2.0, 2.0]",
               grad=lambda g, y, x, **_: _zero(x))
isnan = _unary("isnan", _compare, "True where x is NaN.")
logical_not = _unary("logical_not", boolean, "Logical not of a bool tensor.")

add = _binary("add", numeric, "x1 + x2 with broadcasting.\n\n>>> import ember\n"
              ">>> ember.add(ember.tensor([[1], [2]]), ember.tensor([10, 20])).tolist()\n[[11, 21], [12, 22]]",
              grad=lambda g, a, b, need: (g, g))
subtract = _binary("subtract", numeric, "x1 - x2 with broadcasting.",
                   grad=lambda g, a, b, need: (g, negative(g) if need[1] else None))
multiply = _binary("multiply", numeric, "x1 * x2 with broadcasting.",
                   grad=lambda g, a, b, need: (multiply(g, b) if need[0] else None, multiply(g, a) if need[1] else None))
divide = _binary("divide", floating, "True division (ints give float32); x/0 = +-inf or nan.\n\n"
                 ">>> import ember\n>>> ember.divide(ember.tensor([1, 3]), 2).tolist()\n[0.5, 1.5]",
                 grad=lambda g, a, b, need: (divide(g, b) if need[0] else None,
                                             negative(divide(multiply(g, a), multiply(b, b))) if need[1] else None))
floor_divide = _binary("floor_divide", numeric, "Floor division (Python/numpy semantics; int // 0 = 0).",
                       grad=lambda g, a, b, need: (_zero(g), _zero(g)))
remainder = _binary("remainder", numeric, "Remainder with the sign of x2 (Python/numpy); int % 0 = 0.",
                    grad=lambda g, a, b, need: (g, negative(multiply(g, floor_divide(a, b))) if need[1] else None))
pow = _binary("pow", numeric, "x1 ** x2 (ints: wrap on overflow; a negative exponent truncates toward 0).",
              grad=lambda g, a, b, need: _pow_grad(g, a, b, need))  # noqa: A001
maximum = _binary("maximum", _any, "Elementwise max; NaN propagates.",
                  grad=lambda g, a, b, need: _pick_grad(g, less(b, a), equal(a, b)))
minimum = _binary("minimum", _any, "Elementwise min; NaN propagates.",
                  grad=lambda g, a, b, need: _pick_grad(g, less(a, b), equal(a, b)))
equal = _binary("equal", _compare, "x1 == x2.")
not_equal = _binary("not_equal", _compare, "x1 != x2 (True where either is NaN).")
less = _binary("less", _compare, "x1 < x2.")
less_equal = _binary("less_equal", _compare, "x1 <= x2.")
logical_and = _binary("logical_and", boolean, "Logical and of bool tensors.")
logical_or = _binary("logical_or", boolean, "Logical or of bool tensors.")
greater = _binary("greater", _compare, "x1 > x2.", lambda a, b: less(b, a))
greater_equal = _binary("greater_equal", _compare, "x1 >= x2.", lambda a, b: less_equal(b, a))
logical_xor = _binary("logical_xor", boolean, "Logical xor of bool tensors.", lambda a, b: not_equal(a, b))

isinf = _unary("isinf", _compare, "True where x is +-inf.",
               lambda x: equal(abs(x), float("inf")) if x.dtype.kind == "f"
               else full(x.shape, False, dtype=_dt.bool_, device=x.device))
isfinite = _unary("isfinite", _compare, "True where x is neither NaN nor +-inf.",
                  lambda x: logical_not(logical_or(isnan(x), isinf(x))))
reciprocal = _unary("reciprocal", floating, "1 / x.", lambda x: divide(1.0, x),
                    grad=keeps_output(lambda g, y, x, **_: negative(multiply(g, multiply(y, y)))))
rsqrt = _unary("rsqrt", floating, "1 / sqrt(x).", lambda x: divide(1.0, sqrt(x)),
               grad=keeps_output(lambda g, y, x, **_: multiply(g, multiply(multiply(y, multiply(y, y)), -0.5))))
square = _unary("square", numeric, "x * x.", lambda x: multiply(x, x),
                grad=lambda g, y, x, **_: multiply(g, multiply(x, 2.0)))


# the rest of the array API's elementwise functions: kernels on the CPU backends, the others
# through host_fallback (no WGSL for them yet)
def _g(fn):
    return lambda g, y, x, **_: multiply(g, fn(x))


acos = _unary("acos", floating, "Inverse cosine; nan outside [-1, 1].", cpu_only=True,
              grad=_g(lambda x: negative(rsqrt(subtract(1.0, square(x))))))
acosh = _unary("acosh", floating, "Inverse hyperbolic cosine; nan below 1.", cpu_only=True,
               grad=_g(lambda x: rsqrt(subtract(square(x), 1.0))))
asin = _unary("asin", floating, "Inverse sine; nan outside [-1, 1].", cpu_only=True,
              grad=_g(lambda x: rsqrt(subtract(1.0, square(x)))))
asinh = _unary("asinh", floating, "Inverse hyperbolic sine.", cpu_only=True,
               grad=_g(lambda x: rsqrt(add(square(x), 1.0))))
atan = _unary("atan", floating, "Inverse tangent.", cpu_only=True,
              grad=_g(lambda x: reciprocal(add(square(x), 1.0))))
atanh = _unary("atanh", floating, "Inverse hyperbolic tangent; +-inf at +-1, nan beyond.", cpu_only=True,
               grad=_g(lambda x: reciprocal(subtract(1.0, square(x)))))
cosh = _unary("cosh", floating, "Hyperbolic cosine.", cpu_only=True, grad=_g(lambda x: sinh(x)))
sinh = _unary("sinh", floating, "Hyperbolic sine.", cpu_only=True, grad=_g(lambda x: cosh(x)))
tan = _unary("tan", floating, "Tangent (radians).", cpu_only=True,
             grad=_g(lambda x: add(square(tan(x)), 1.0)))
expm1 = _unary("expm1", floating, "exp(x) - 1, accurate near 0.", cpu_only=True, grad=_g(lambda x: exp(x)))
log1p = _unary("log1p", floating, "log(1 + x), accurate near 0.", cpu_only=True,
               grad=_g(lambda x: reciprocal(add(x, 1.0))))
log2 = _unary("log2", floating, "Base-2 log.", cpu_only=True,
              grad=_g(lambda x: reciprocal(multiply(x, math.log(2.0)))))
log10 = _unary("log10", floating, "Base-10 log.", cpu_only=True,
               grad=_g(lambda x: reciprocal(multiply(x, math.log(10.0)))))
trunc = _unary("trunc", numeric, "Round toward 0 (ints unchanged; -0.0 stays -0.0).", cpu_only=True,
               grad=lambda g, y, x, **_: _zero(x))
signbit = _unary("signbit", _compare, "True where the sign bit is set (-0.0 and -nan included).", cpu_only=True)
atan2 = _binary("atan2", floating, "The angle of the point (x2, x1), in (-pi, pi].", cpu_only=True)
copysign = _binary("copysign", floating, "|x1| with the sign of x2.", cpu_only=True)
hypot = _binary("hypot", floating, "sqrt(x1**2 + x2**2) without overflow.", cpu_only=True)
logaddexp = _binary("logaddexp", floating, "log(exp(x1) + exp(x2)) without overflow.", cpu_only=True)
bitwise_and = _binary("bitwise_and", integral, "x1 & x2 on integer (or bool) tensors.", cpu_only=True)
bitwise_or = _binary("bitwise_or", integral, "x1 | x2 on integer (or bool) tensors.", cpu_only=True)
bitwise_xor = _binary("bitwise_xor", integral, "x1 ^ x2 on integer (or bool) tensors.", cpu_only=True)
bitwise_left_shift = _binary("bitwise_left_shift", lambda n: integral(n, False),
                             "x1 << x2 (wraps; a count >= the bit width gives 0).", cpu_only=True)
bitwise_right_shift = _binary("bitwise_right_shift", lambda n: integral(n, False),
                              "x1 >> x2, arithmetic for signed ints.", cpu_only=True)
op("bitwise_invert", kind="composite", shape=same_shape, dtype=integral("bitwise_invert"),
   decompose=host_fallback("bitwise_invert"), doc="~x: bitwise not of ints, logical not of bools.")


@method
def bitwise_invert(x: Tensor) -> Tensor:
    """~x: bitwise not of an integer tensor (wraps), logical not of a bool one."""
    if x.dtype is _dt.bool_:
        return logical_not(x)
    return apply("bitwise_invert", x)


@method
def positive(x: Tensor) -> Tensor:
    """+x (the tensor itself: tensors are immutable)."""
    numeric("positive")(x.dtype)
    return x


# ---- where / cast / clip ---------------------------------------------------------------------

def _where_dtype(c, a, b, **_):
    boolean("where")(c)
    return promote(a, b)


def _where_grad(g, y, c, a, b, *, need, **_):
    return (None,
            sum_to(where(c, g, 0.0), a.shape) if need[1] else None,
            sum_to(where(c, 0.0, g), b.shape) if need[2] else None)


op("where", kind="ternary", shape=lambda c, a, b, **_: broadcast_shapes(c, a, b, op="where"),
   dtype=_where_dtype, doc="x1 where condition else x2.", grad=_where_grad)


def where(condition: Tensor, x1, x2) -> Tensor:
    """``x1`` where ``condition`` (a bool tensor) is True, else ``x2``, with broadcasting.

    >>> import ember
    >>> c = ember.tensor([True, False, True])
    >>> ember.where(c, ember.tensor([1.0, 2.0, 3.0]), 0.0).tolist()
    [1.0, 0.0, 3.0]
    """
    if not isinstance(condition, Tensor):
        raise DTypeError(f"where: condition must be a bool Tensor, got {type(condition).__name__}")
    if not isinstance(x1, Tensor) and not isinstance(x2, Tensor):
        x1 = full((), x1, dtype=_dt.scalar_dtype(x1), device=condition.device)
    x1, x2 = _common(*_args(x1, x2), _any)
    return apply("where", condition, x1, x2)


op("cast", kind="unary", shape=same_shape, dtype=lambda x, *, dtype, **_: dtype,
   doc="Convert to another dtype (see astype).", grad=lambda g, y, x, **_: g)  # cast back by autograd


@method
def astype(x: Tensor, dtype, /, *, copy: bool = True, device=None) -> Tensor:
    """``x`` converted to ``dtype``: float -> int truncates toward zero and saturates at the
    int range, NaN -> 0 (the same on every backend); int -> int wraps; -> bool is ``x != 0``
    (so NaN -> True); -> float16 rounds to nearest even, overflow -> inf.

    >>> import ember
    >>> ember.tensor([-1.7, 2.9, float("nan")]).astype("int32").tolist()
    [-1, 2, 0]

    ``copy`` (array API) changes nothing but identity: tensors are immutable, so ``copy=False``
    returns ``x`` itself when the dtype already matches. ``device`` moves the result.
    """
    if device is not None and device != x.device:
        return astype(x.to(device), dtype, copy=copy)
    dt = _dt.get(dtype)
    if dt is x.dtype:
        return x   # immutable: a copy could not be told apart
    _dt.check_device(dt, x.device)
    return apply("cast", x, dtype=dt)


def _clip_dtype(x, **_):
    if x is _dt.bool_:
        raise DTypeError("clip: not defined for bool tensors")
    return x


def _clip_decompose(x, *, min=None, max=None):  # noqa: A002
    y = x
    if min is not None:
        y = maximum(y, min)
    if max is not None:
        y = minimum(y, max)
    return y if y.dtype is x.dtype else astype(y, x.dtype)


def _clip_grad(g, y, x, *, min=None, max=None, **_):  # noqa: A002
    # the gradient passes where min <= x <= max (bounds included, as PyTorch's clamp)
    keep = None
    if min is not None:
        keep = less_equal(min, x)
    if max is not None:
        k = less_equal(x, max)
        keep = k if keep is None else logical_and(keep, k)
    return g if keep is None else where(keep, g, 0.0)


op("clip", kind="composite", shape=lambda x, **_: x, dtype=_clip_dtype, decompose=_clip_decompose,
   doc="Clamp to [min, max] (Python scalar bounds).", grad=_clip_grad)


@method
def clip(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    """Clamp ``x`` to [``min``, ``max``] (scalars or tensors that broadcast; either may be None).
    The result keeps ``x``'s dtype; NaN stays NaN.

    >>> import ember
    >>> ember.clip(ember.tensor([-2.0, 0.5, 3.0]), 0, 1).tolist()
    [0.0, 0.5, 1.0]
    """
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        _clip_dtype(x.dtype)
        return _clip_decompose(x, min=min, max=max)
    return apply("clip", x, min=min, max=max)


# ---- Python operators ------------------------------------------------------------------------

def _operand_ok(v) -> bool:
    return isinstance(v, (Tensor, bool, int, float, list, tuple)) or hasattr(v, "__array_interface__")


def _op(fn, reflected=False):
    if reflected:
        def dunder(self, other):
            return fn(other, self) if _operand_ok(other) else NotImplemented
    else:
        def dunder(self, other):
            return fn(self, other) if _operand_ok(other) else NotImplemented
    return dunder


def _logical(name, fn, bitwise):
    """& | ^: logical on two bool tensors, bitwise on integers (array API)."""
    def f(x1, x2):
        x1, x2 = _args(x1, x2)
        if x1.dtype is _dt.bool_ and x2.dtype is _dt.bool_:
            return fn(x1, x2)
        return bitwise(x1, x2)
    return f


def _invert(x):
    return bitwise_invert(x)


for _name, _fn in [("add", add), ("sub", subtract), ("mul", multiply), ("truediv", divide),
                   ("floordiv", floor_divide), ("mod", remainder), ("pow", pow),
                   ("and", _logical("and", logical_and, bitwise_and)), ("or", _logical("or", logical_or, bitwise_or)),
                   ("xor", _logical("xor", logical_xor, bitwise_xor)), ("lshift", bitwise_left_shift),
                   ("rshift", bitwise_right_shift)]:
    setattr(Tensor, f"__{_name}__", _op(_fn))
    setattr(Tensor, f"__r{_name}__", _op(_fn, reflected=True))
for _name, _fn in [("eq", equal), ("ne", not_equal), ("lt", less), ("le", less_equal), ("gt", greater),
                   ("ge", greater_equal)]:
    setattr(Tensor, f"__{_name}__", _op(_fn))
Tensor.__hash__ = object.__hash__  # __eq__ is elementwise; identity hashing keeps tensors usable as keys
Tensor.__neg__ = negative
Tensor.__pos__ = positive
Tensor.__abs__ = abs
Tensor.__invert__ = _invert
