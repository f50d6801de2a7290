"""Ops on quantized weights (formats and storage: ``ember.quant``).

A quantized weight ``w`` is a 1-D int32 tensor of ``ceil(n * row_bytes(qtype, k) / 4)`` words
holding the raw GGUF blocks of ``n`` rows of ``k`` elements; ``qtype``, ``n`` and ``k`` are op
attributes, so one kernel serves every weight of a format and a captured plan replays them.

- ``dequantize(w, *, qtype, n, k)`` -> ``(n, k)`` float32 (a primitive).
- ``qlinear(x, w, *, qtype, n, k)`` -> ``x.shape[:-1] + (n,)`` float32, ``x @ dequantize(w).T``;
  a composite that decomposes to exactly that, which backends override without expanding the
  weight.
- ``qembedding(ids, w, *, qtype, n, k)`` -> ``ids.shape + (k,)`` float32, rows of the weight;
  an id outside ``[0, n)`` raises IndexingError (negative ids are errors, not counted from the
  end). A composite: the decomposition gathers the rows' words and dequantizes only those.

Most code uses them through ``ember.quant.QTensor`` and ``quant.linear`` / ``quant.embedding``.

>>> import ember
>>> from ember import quant
>>> w = quant.QTensor.quantize(ember.tensor([[1.0] * 32, [2.0] * 32]), "q4_0")
>>> ember.qlinear(ember.ones((1, 32)), w.data, qtype="q4_0", n=2, k=32).tolist()
[[32.0, 64.0]]
>>> ember.qembedding(ember.tensor([1]), w.data, qtype="q4_0", n=2, k=32).shape
(1, 32)
"""
from __future__ import annotations

import operator

from .. import dtypes as _dt
from ..errors import DTypeError, ShapeError
from ..quant import get_format, row_bytes, words
from ..registry import apply, op
from ..tensor import Tensor

__all__ = ["dequantize", "qlinear", "qembedding"]


def _ops():
    from .. import ops
    return ops


def _check_weight(opname: str, ws, *, qtype, n, k) -> None:
    """The weight's words must match ``n`` rows of ``k`` elements of ``qtype``."""
    try:
        fmt = get_format(qtype)
    except DTypeError as e:
        raise DTypeError(f"{opname}: {e}") from None
    for what, v in (("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ShapeError(f"{opname}: {what} must be a non-negative int, got {v!r} (qtype {qtype}, n={n!r}, k={k!r})")
    if k % fmt.block:
        raise ShapeError(f"{opname}: k={k} is not a multiple of the {qtype} block size {fmt.block} "
                         f"(qtype {qtype}, n={n}, k={k})")
    want = words(qtype, n, k)
    if tuple(ws) != (want,):
        raise ShapeError(f"{opname}: a {qtype} weight of n={n} rows and k={k} columns is 1-D of {want} int32 words "
                         f"({n} x {row_bytes(qtype, k)} bytes), got shape {tuple(ws)}")


def _check_words_dtype(opname: str, wt) -> None:
    if wt is not _dt.int32:
        raise DTypeError(f"{opname}: the quantized weight must be int32 words of raw blocks, got {wt.name}")


# ---- dequantize (primitive) ----------------------------------------------------------------------

def _dequantize_shape(ws, *, qtype, n, k):
    _check_weight("dequantize", ws, qtype=qtype, n=n, k=k)
    return (n, k)


def _dequantize_dtype(wt, **_):
    _check_words_dtype("dequantize", wt)
    return _dt.float32


op("dequantize", kind="other", shape=_dequantize_shape, dtype=_dequantize_dtype,
   doc="int32 words of n rows of k qtype-quantized elements -> (n, k) float32")


# ---- qlinear (composite) -------------------------------------------------------------------------

def _qlinear_shape(xs, ws, *, qtype, n, k):
    _check_weight("qlinear", ws, qtype=qtype, n=n, k=k)
    if not xs:
        raise ShapeError(f"qlinear: x must have at least 1 dimension, got a scalar (qtype {qtype}, n={n}, k={k})")
    if xs[-1] != k:
        raise ShapeError(f"qlinear: x has {xs[-1]} features (last axis of {tuple(xs)}) but the {qtype} weight "
                         f"(n={n}, k={k}) expects k={k}")
    return tuple(xs[:-1]) + (n,)


def _qlinear_dtype(xt, wt, **_):
    if xt.kind != "f":
        raise DTypeError(f"qlinear: x must be floating point, got {xt.name} (cast with .astype(ember.float32))")
    _check_words_dtype("qlinear", wt)
    return _dt.float32


def _dec_qlinear(x, w, *, qtype, n, k):
    o = _ops()
    if x.dtype is not _dt.float32:
        x = o.astype(x, _dt.float32)
    return o.linear(x, apply("dequantize", w, qtype=qtype, n=n, k=k))


op("qlinear", kind="composite", shape=_qlinear_shape, dtype=_qlinear_dtype, decompose=_dec_qlinear,
   doc="x @ dequantize(w).T: a linear layer with a quantized (n, k) weight; backends override it "
       "without expanding the weight")


# ---- qembedding (composite) ----------------------------------------------------------------------

def _qembedding_shape(ids, ws, *, qtype, n, k):
    _check_weight("qembedding", ws, qtype=qtype, n=n, k=k)
    return tuple(ids) + (k,)


def _qembedding_dtype(it, wt, **_):
    if it.kind not in "iu":
        raise DTypeError(f"qembedding: ids must be integers, got {it.name}")
    _check_words_dtype("qembedding", wt)
    return _dt.float32


def _dec_qembedding(ids, w, *, qtype, n, k):
    o = _ops()
    flat = o.reshape(ids, (ids.size,))
    # a negative id is out of range here (take would count it from the end): map it to n
    flat = o.where(o.less(flat, 0), n, flat)
    rb = row_bytes(qtype, k)
    m = flat.shape[0]
    if rb % 4 == 0:   # whole words per row: gather the rows' words, dequantize only those
        rows = o.take(o.reshape(w, (n, rb // 4)), flat, axis=0)
        out = apply("dequantize", o.reshape(rows, (m * (rb // 4),)), qtype=qtype, n=m, k=k)
    else:             # rows straddle words: the reference path expands the weight
        out = o.take(apply("dequantize", w, qtype=qtype, n=n, k=k), flat, axis=0)
    return o.reshape(out, tuple(ids.shape) + (k,))


op("qembedding", kind="composite", shape=_qembedding_shape, dtype=_qembedding_dtype, decompose=_dec_qembedding,
   doc="rows of a quantized (n, k) weight picked by integer ids in [0, n) -> ids.shape + (k,) float32")


# ---- public functions ----------------------------------------------------------------------------

def _attrs(opname, qtype, n, k) -> dict:
    try:
        return {"qtype": qtype, "n": operator.index(n), "k": operator.index(k)}
    except TypeError:
        raise ShapeError(f"{opname}: n and k must be ints, got n={n!r}, k={k!r}") from None


def _need_tensor(opname: str, **named) -> None:
    for what, t in named.items():
        if not isinstance(t, Tensor):
            raise DTypeError(f"{opname}: {what} must be an ember Tensor, got {type(t).__name__}"
                             + (" (pass w.data and w.qtype for a QTensor, or use ember.quant)"
                                if type(t).__name__ == "QTensor" else ""))


def dequantize(w: Tensor, *, qtype: str, n: int, k: int) -> Tensor:
    """The ``(n, k)`` float32 values of a quantized weight (int32 words of ``qtype`` blocks).

    >>> import ember
    >>> from ember import quant
    >>> w = quant.QTensor.quantize(ember.tensor([[0.25] * 32]), "q4_1")
    >>> ember.dequantize(w.data, qtype="q4_1", n=1, k=32).tolist()[0][:3]
    [0.25, 0.25, 0.25]
    """
    _need_tensor("dequantize", w=w)
    return apply("dequantize", w, **_attrs("dequantize", qtype, n, k))


def qlinear(x: Tensor, w: Tensor, *, qtype: str, n: int, k: int) -> Tensor:
    """``x @ dequantize(w).T`` with ``w`` the int32 words of an ``(n, k)`` quantized weight:
    output ``x.shape[:-1] + (n,)`` float32.

    >>> import ember
    >>> from ember import quant
    >>> w = quant.QTensor.quantize(ember.tensor([[1.0] * 32]), "q4_0")
    >>> ember.qlinear(ember.ones((2, 32)), w.data, qtype="q4_0", n=1, k=32).tolist()
    [[32.0], [32.0]]
    """
    _need_tensor("qlinear", x=x, w=w)
    return apply("qlinear", x, w, **_attrs("qlinear", qtype, n, k))


def qembedding(ids: Tensor, w: Tensor, *, qtype: str, n: int, k: int) -> Tensor:
    """Rows ``ids`` (integers in ``[0, n)``) of the ``(n, k)`` quantized weight ``w``: output
    ``ids.shape + (k,)`` float32.

    >>> import ember
    >>> from ember import quant
    >>> w = quant.QTensor.quantize(ember.tensor([[1.0] * 32, [-2.0] * 32]), "q4_0")
    >>> [r[:2] for r in ember.qembedding(ember.tensor([[1]]), w.data, qtype="q4_0", n=2, k=32).tolist()[0]]
    [[-2.0, -2.0]]
    """
    _need_tensor("qembedding", ids=ids, w=w)
    return apply("qembedding", ids, w, **_attrs("qembedding", qtype, n, k))
