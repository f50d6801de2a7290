"""Op cases for the neural-network family (ember.ops.nnops), picked up by ``op_cases.all_cases()``:
run by tests/test_ops_nn.py on every backend and, unchanged, inside Pyodide by
tests/test_pyodide.py. Standard library only at import time.

Three kinds:

- golden cases: inputs and PyTorch outputs from tests/golden/nn_ops.safetensors (made once by
  tests/golden/make_nn_goldens.py), read here with a few lines of ``struct``/``json``;
  every composite op among them runs twice: with the backend's kernel and through its
  decomposition (``<id>/decomposed``: the backend's nn composite kernels are set aside);
- numpy-referenced cases (activations, softmax, cumsum, sort, topk, pad, float16 variants);
- error cases: bad shapes, dtypes and arguments raise typed errors naming the op and shapes.
"""
from __future__ import annotations

import json
import math
import os
import struct

from op_cases import OpCase, S

CASES: list = []
GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "nn_ops.safetensors")

# The nn ops with a decomposition: the python and numpy backends override some with kernels.
COMPOSITES = ("relu", "leaky_relu", "sigmoid", "gelu", "silu", "softmax", "log_softmax", "adaptive_avg_pool2d",
              "batch_norm", "layer_norm", "embedding", "scaled_dot_product_attention", "argsort", "topk")


def add(*cases):
    CASES.extend(cases)


def decomposed(fn):
    """``fn`` run with the backend's kernels for the nn composites set aside, so the registry
    takes each op's decomposition (the path a backend without those kernels takes)."""
    def run(e, *ts):
        kernels = e.get_backend(ts[0].device).kernels
        saved = {n: kernels.pop(n) for n in COMPOSITES if n in kernels}
        try:
            return fn(e, *ts)
        finally:
            kernels.update(saved)
    return run


# ---- golden cases (PyTorch) -----------------------------------------------------------------

_ST = {"F32": ("f", "float32"), "I64": ("q", "int64"), "BOOL": ("?", "bool")}


def read_safetensors(path):
    """{name: (flat values, shape, ember dtype name)} and the metadata of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        code, dtype = _ST[info["dtype"]]
        a, b = info["data_offsets"]
        count = (b - a) // struct.calcsize(code)
        out[name] = (list(struct.unpack(f"<{count}{code}", data[a:b])), tuple(info["shape"]), dtype)
    return out, meta


def _golden_fn(op, names, kwargs, mode):
    if mode == "sort":
        return lambda e, x: [e.sort(x, **kwargs), e.argsort(x, **kwargs)]
    if mode == "values":
        return lambda e, *ts: [getattr(e, op)(*ts, **kwargs)[0]]
    return lambda e, *ts: getattr(e, op)(**dict(zip(names, ts)), **kwargs)


def _expected(outs):
    def ref(np, *_):
        return [np.array(flat, dtype=dt).reshape(shape) for flat, shape, dt in outs]
    return ref


def _golden_cases():
    tensors, meta = read_safetensors(GOLDEN)
    for c in json.loads(meta["cases"]):
        ins = [tensors[f"{c['id']}/in{k}"] for k in range(len(c["names"]))]
        outs = [tensors[f"{c['id']}/out{k}"] for k in range(c["n_out"])]
        if c["mode"] == "values":
            outs = outs[:1]
        specs = [S(shape, dt, values=flat) for flat, shape, dt in ins]
        rtol, atol = c["tol"] or (1e-5, 1e-5)
        fn = _golden_fn(c["op"], c["names"], c["kwargs"], c["mode"])
        add(OpCase(c["id"], fn, _expected(outs), specs, rtol, atol))
        if c["op"] in COMPOSITES or c["mode"] == "sort":
            add(OpCase(c["id"] + "/decomposed", decomposed(fn), _expected(outs), specs, rtol, atol))
        if c["id"] in _HALF:   # the same case in float16: PyTorch's float32 result, float16 tolerance
            half = [S(shape, "float16", values=_to_half(flat)) if dt == "float32" else S(shape, dt, values=flat)
                    for flat, shape, dt in ins]
            add(OpCase(c["id"] + "/f16", fn, _expected(outs), half, 1e-2, 1e-2, dtype="float16"))


def _to_half(flat):
    return [struct.unpack("<e", struct.pack("<e", v))[0] for v in flat]


_HALF = {"conv2d/basic", "conv_transpose2d/basic", "max_pool2d/k2", "avg_pool2d/k3_s2_p1",
         "layer_norm/last", "batch_norm/affine", "softmax/neg_inf", "gelu/erf", "sdpa/plain"}

_golden_cases()


# ---- numpy-referenced cases ---------------------------------------------------------------------

F, H = "float32", "float16"
SHAPES = [(), (0,), (5,), (2, 3, 4)]


def _sid(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


def _np_sigmoid(np, x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _np_gelu(np, x, approximate):
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))) if x.size else x


def _np_softmax(np, x, axis, log=False):
    x = x.astype(np.float64)
    if x.ndim == 0:
        x = x.reshape(1)
        return _np_softmax(np, x, 0, log).reshape(())
    z = x - x.max(axis=axis, keepdims=True) if x.size else x
    if log:
        return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


ACTIVATIONS = {
    "relu": (lambda e, x: e.relu(x), lambda np, x: np.maximum(x, np.zeros((), x.dtype))),
    "leaky_relu": (lambda e, x: e.leaky_relu(x, 0.1),
                   lambda np, x: np.where(x < 0, x.astype(np.float64) * 0.1, x).astype(x.dtype)),
    "sigmoid": (lambda e, x: e.sigmoid(x), _np_sigmoid),
    # ember.nn's ReLU6 / Hardtanh (EfficientNet-Lite, MobileNet): clip, NaN kept
    "relu6": (lambda e, x: e.nn.functional.relu6(x), lambda np, x: np.clip(x, 0, 6).astype(x.dtype)),
    "hardtanh": (lambda e, x: e.nn.functional.hardtanh(x, -2.5, 4.0), lambda np, x: np.clip(x, -2.5, 4.0).astype(x.dtype)),
    "silu": (lambda e, x: e.silu(x), lambda np, x: x * _np_sigmoid(np, x)),
    "gelu": (lambda e, x: e.gelu(x), lambda np, x: _np_gelu(np, x, "none")),
    "gelu_tanh": (lambda e, x: e.gelu(x, approximate="tanh"), lambda np, x: _np_gelu(np, x, "tanh")),
    "softmax": (lambda e, x: e.softmax(x), lambda np, x: _np_softmax(np, x, -1)),
    "log_softmax": (lambda e, x: e.log_softmax(x), lambda np, x: _np_softmax(np, x, -1, log=True)),
}
for _name, (_efn, _nfn) in ACTIVATIONS.items():
    for _sh in SHAPES:
        for _dt in (F, H):
            _d = "float16" if _dt == H else None
            add(OpCase(f"{_name}/{_dt}/{_sid(_sh)}", _efn, _nfn, [S(_sh, _dt, -6.0, 6.0)], dtype=_d))
            add(OpCase(f"{_name}/{_dt}/{_sid(_sh)}/decomposed", decomposed(_efn), _nfn, [S(_sh, _dt, -6.0, 6.0)],
                       dtype=_d))
    # NaN, +-inf, +-0 (softmax of a row holding NaN or +inf is NaN, as in numpy and PyTorch)
    add(OpCase(f"{_name}/special", _efn, _nfn, [S((3, 5), F, special=True)]))
    add(OpCase(f"{_name}/special/decomposed", decomposed(_efn), _nfn, [S((3, 5), F, special=True)]))
    add(OpCase(f"{_name}/wide", _efn, _nfn, [S((4, 7), F, -80.0, 80.0)], 1e-5, 1e-6))

# integer inputs: relu keeps the dtype, the others compute in float32
add(OpCase("relu/int32", lambda e, x: e.relu(x), lambda np, x: np.maximum(x, 0).astype(np.int32), [S((7,), "int32")]))
add(OpCase("relu/int64/decomposed", decomposed(lambda e, x: e.relu(x)), lambda np, x: np.maximum(x, 0),
           [S((7,), "int64")]))
add(OpCase("sigmoid/int64", lambda e, x: e.sigmoid(x), _np_sigmoid, [S((6,), "int64")]))
add(OpCase("softmax/int32/axis0", lambda e, x: e.softmax(x, axis=0), lambda np, x: _np_softmax(np, x, 0),
           [S((3, 4), "int32")]))
for _ax in (0, 1, -3):
    add(OpCase(f"softmax/axis{_ax}", lambda e, x, a=_ax: e.softmax(x, axis=a), lambda np, x, a=_ax: _np_softmax(np, x, a),
               [S((2, 3, 4), F, -20.0, 20.0)]))
    add(OpCase(f"log_softmax/axis{_ax}", lambda e, x, a=_ax: x.log_softmax(a),
               lambda np, x, a=_ax: _np_softmax(np, x, a, log=True), [S((2, 3, 4), F, -20.0, 20.0)]))
    add(OpCase(f"softmax/axis{_ax}/decomposed", decomposed(lambda e, x, a=_ax: e.softmax(x, axis=a)),
               lambda np, x, a=_ax: _np_softmax(np, x, a), [S((2, 3, 4), F, -20.0, 20.0)]))


# cumsum: ONNX's exclusive / reverse flags, integer promotion to int64
def _np_cumsum(np, x, axis, exclusive=False, reverse=False):
    dt = x.dtype if x.dtype.kind == "f" else np.int64
    a = np.flip(x, axis) if reverse else x
    r = np.cumsum(a.astype(np.float64 if x.dtype.kind == "f" else np.int64), axis=axis)
    if exclusive:
        r = np.moveaxis(r, axis, 0)
        r = np.moveaxis(np.concatenate([np.zeros_like(r[:1]), r[:-1]]) if len(r) else r, 0, axis)
    return (np.flip(r, axis) if reverse else r).astype(dt)


for _sh, _ax in [((6,), 0), ((3, 4), 0), ((3, 4), 1), ((2, 3, 4), 1), ((2, 3, 4), -1), ((2, 0, 3), 1)]:
    for _ex in (False, True):
        for _rv in (False, True):
            add(OpCase(f"cumsum/{_sid(_sh)}/axis{_ax}/ex{int(_ex)}rv{int(_rv)}",
                       lambda e, x, a=_ax, ex=_ex, rv=_rv: e.cumsum(x, a, exclusive=ex, reverse=rv),
                       lambda np, x, a=_ax, ex=_ex, rv=_rv: _np_cumsum(np, x, a, ex, rv), [S(_sh, F)], 1e-5, 1e-5))
for _dt in ("int32", "uint8", "bool", "int64"):
    add(OpCase(f"cumsum/{_dt}/method_axis1", lambda e, x: x.cumsum(1), lambda np, x: np.cumsum(x.astype(np.int64), axis=1),
               [S((3, 5), _dt)]))
add(OpCase("cumsum/f16", lambda e, x: e.cumsum(x, 0), lambda np, x: np.cumsum(x.astype(np.float32)).astype(np.float16),
           [S((8,), H)], dtype="float16"))
add(OpCase("cumsum/scalar", lambda e, x: e.cumsum(x, 0), lambda np, x: x, [S((), F)]))


# sort / argsort / topk against numpy (NaN sorts last ascending, first descending)
def _np_topk(np, x, k, axis, largest):
    key = -x.astype(np.float64) if largest else x
    idx = np.take(np.argsort(key, axis=axis, kind="stable"), range(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int64)]


def _np_sort_desc(np, x):
    # stable descending with NaN first: primary key "is not NaN", then -x (lexsort is stable)
    nan = np.isnan(x)
    idx = np.lexsort((-np.where(nan, 0, x), ~nan))
    return [x[idx], idx.astype(np.int64)]


def _np_sort(np, x, axis):
    if x.ndim == 0:
        return [x, np.zeros((), np.int64)]
    return [np.sort(x, axis=axis), np.argsort(x, axis=axis, kind="stable").astype(np.int64)]


for _sh, _ax in [((7,), 0), ((3, 5), 0), ((3, 5), 1), ((2, 3, 4), 1), ((2, 0, 3), 2), ((), 0)]:
    add(OpCase(f"sort/{_sid(_sh)}/axis{_ax}", lambda e, x, a=_ax: [e.sort(x, a), e.argsort(x, a)],
               lambda np, x, a=_ax: _np_sort(np, x, a), [S(_sh, F)]))
    add(OpCase(f"sort/{_sid(_sh)}/axis{_ax}/desc", lambda e, x, a=_ax: e.sort(x, a, descending=True),
               lambda np, x, a=_ax: np.flip(np.sort(x, axis=a), axis=a) if x.ndim else x, [S(_sh, F)]))
for _dt in ("int32", "uint8", "int64", "float16"):
    add(OpCase(f"sort/{_dt}", lambda e, x: [x.sort(), x.argsort()],
               lambda np, x: [np.sort(x, axis=-1), np.argsort(x, axis=-1, kind="stable").astype(np.int64)],
               [S((4, 6), _dt)]))
add(OpCase("sort/nan", lambda e, x: [e.sort(x), e.argsort(x)],
           lambda np, x: [np.sort(x), np.argsort(x, kind="stable").astype(np.int64)],
           [S((9,), F, values=[3.0, math.nan, -1.0, math.inf, 0.5, -math.inf, math.nan, 2.0, -1.0])]))
add(OpCase("sort/nan/desc", lambda e, x: [e.sort(x, descending=True), e.argsort(x, descending=True)],
           lambda np, x: _np_sort_desc(np, x),
           [S((9,), F, values=[3.0, math.nan, -1.0, math.inf, 0.5, -math.inf, math.nan, 2.0, -1.0])]))
for _k, _ax, _lg in [(1, -1, True), (3, -1, True), (2, 0, False), (0, 1, True), (5, 1, False)]:
    add(OpCase(f"topk/k{_k}/axis{_ax}/largest{int(_lg)}", lambda e, x, k=_k, a=_ax, lg=_lg: list(x.topk(k, a, lg)),
               lambda np, x, k=_k, a=_ax, lg=_lg: _np_topk(np, x, k, a, lg), [S((3, 5), F)]))
    add(OpCase(f"topk/k{_k}/axis{_ax}/largest{int(_lg)}/decomposed",
               decomposed(lambda e, x, k=_k, a=_ax, lg=_lg: list(x.topk(k, a, lg))),
               lambda np, x, k=_k, a=_ax, lg=_lg: _np_topk(np, x, k, a, lg), [S((3, 5), F)]))
add(OpCase("topk/int64", lambda e, x: list(e.topk(x, 2)), lambda np, x: _np_topk(np, x, 2, -1, True),
           [S((4, 6), "int64", -1000, 1000)]))


# pad: every mode against np.pad; negative widths crop first
def _np_pad(np, x, pw, mode, value=0):
    crop = tuple(slice(max(-b, 0), n - max(-a, 0)) for n, (b, a) in zip(x.shape, pw))
    x = x[crop]
    widths = [(max(b, 0), max(a, 0)) for b, a in pw]
    if mode == "constant":
        return np.pad(x, widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode=mode)


for _mode in ("constant", "reflect", "edge", "wrap"):
    for _sh, _pw in [((5,), [(2, 3)]), ((3, 4), [(1, 0), (2, 2)]), ((2, 3, 4), [(0, 1), (1, 1), (3, 0)]),
                     ((3, 4), [(7, 9), (5, 4)]), ((1, 3), [(2, 1), (0, 2)]), ((4, 5), [(-1, 2), (3, -2)]),
                     ((2, 3), [(0, 0), (0, 0)])]:
        _id = "_".join(f"{b}.{a}" for b, a in _pw)
        add(OpCase(f"pad/{_mode}/{_sid(_sh)}/{_id}", lambda e, x, pw=_pw, m=_mode: e.pad(x, pw, m),
                   lambda np, x, pw=_pw, m=_mode: _np_pad(np, x, pw, m), [S(_sh, F)]))
add(OpCase("pad/one_pair_all_axes", lambda e, x: e.pad(x, (1, 2), value=-3.5),
           lambda np, x: np.pad(x, (1, 2), constant_values=-3.5), [S((2, 3), F)]))
add(OpCase("pad/int_width", lambda e, x: e.pad(x, 1, mode="edge"), lambda np, x: np.pad(x, 1, mode="edge"),
           [S((2, 3), "int32")]))
add(OpCase("pad/int64_value", lambda e, x: e.pad(x, [(1, 1)], value=7), lambda np, x: np.pad(x, (1, 1), constant_values=7),
           [S((4,), "int64")]))
add(OpCase("pad/uint8_reflect", lambda e, x: e.pad(x, [(0, 0), (2, 3)], mode="reflect"),
           lambda np, x: np.pad(x, [(0, 0), (2, 3)], mode="reflect"), [S((2, 4), "uint8")]))
add(OpCase("pad/bool", lambda e, x: e.pad(x, [(1, 2)], value=True), lambda np, x: np.pad(x, (1, 2), constant_values=True),
           [S((3,), "bool")]))
add(OpCase("pad/f16_wrap", lambda e, x: e.pad(x, [(3, 1)], mode="wrap"), lambda np, x: np.pad(x, (3, 1), mode="wrap"),
           [S((4,), H)]))
add(OpCase("pad/empty_axis_constant", lambda e, x: e.pad(x, [(1, 1), (0, 2)], value=2.0),
           lambda np, x: np.pad(x, [(1, 1), (0, 2)], constant_values=2.0), [S((0, 3), F)]))
add(OpCase("pad/scalar", lambda e, x: e.pad(x, []), lambda np, x: x, [S((), F)]))

# embedding and the norms against numpy, including float16
def _np_layer_norm(np, x, w, b, eps=1e-5):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b


add(OpCase("embedding/1d", lambda e, i, w: e.embedding(i, w), lambda np, i, w: w[i], [S((5,), "int64", 0, 3), S((4, 3), F)]))
add(OpCase("embedding/int32/decomposed", decomposed(lambda e, i, w: e.embedding(i, w)), lambda np, i, w: w[i],
           [S((2, 2), "int32", 0, 5), S((6, 2), F)]))
add(OpCase("layer_norm/f16/3d", lambda e, x, w, b: e.layer_norm(x, 4, w, b),
           lambda np, x, w, b: _np_layer_norm(np, x.astype(np.float32), w, b).astype(np.float16),
           [S((2, 3, 4), H), S((4,), H), S((4,), H)], dtype="float16"))

# ---- wasm kernel edges: tails, inner axes, long rows, far tails of the activations ---------------
def _np_batch_norm(np, x, m, v, w, b, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    x = x.astype(np.float64)
    return (x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * w.reshape(shape) + b.reshape(shape)


for _name, (_efn, _nfn) in ACTIVATIONS.items():
    for _sh in ((1,), (3,), (7,), (37,), (5, 9)):
        add(OpCase(f"{_name}/edge/{_sid(_sh)}", _efn, _nfn, [S(_sh, F, -8.0, 8.0)]))
_ACT_EDGES = [-100.0, -20.0, -13.0, -9.0, -5.5, -3.0, -1.2374369, -1.2374368, -0.875, 0.0, -0.0, 1e-30, -1e-30,
              0.875, 1.2374369, 3.0, 9.0, 20.0, 100.0]
for _name in ("sigmoid", "silu", "gelu", "gelu_tanh"):
    add(OpCase(f"{_name}/edge/values", ACTIVATIONS[_name][0], ACTIVATIONS[_name][1],
               [S((len(_ACT_EDGES),), F, values=_ACT_EDGES)]))
add(OpCase("leaky_relu/edge/n37", lambda e, x: e.leaky_relu(x, 0.2),
           lambda np, x: np.where(x < 0, x.astype(np.float64) * 0.2, x).astype(x.dtype), [S((37,), F, special=True)]))
for _name in ("softmax", "log_softmax"):
    _lg = _name == "log_softmax"
    for _sh, _ax in [((3, 37, 5), 1), ((2, 1000), -1), ((1000, 3), 0), ((4, 3, 9), 0), ((2, 7), 1), ((6, 1), 1),
                     ((5,), 0), ((2, 3, 4, 6), 2)]:
        add(OpCase(f"{_name}/edge/{_sid(_sh)}/axis{_ax}", lambda e, x, a=_ax, n=_name: getattr(e, n)(x, axis=a),
                   lambda np, x, a=_ax, lg=_lg: _np_softmax(np, x, a, log=lg), [S(_sh, F, -10.0, 10.0)]))
    add(OpCase(f"{_name}/edge/masked", lambda e, x, n=_name: getattr(e, n)(x),
               lambda np, x, lg=_lg: _np_softmax(np, x, -1, log=lg),
               [S((2, 6), F, values=[0.0, -math.inf, 1.0, -math.inf, 2.0, 3.0, -math.inf, 5.0, -math.inf, -math.inf, -math.inf,
                                     -math.inf])]))
for _sh, _ns in [((5, 37), (37,)), ((3, 384), (384,)), ((2, 4, 6), (4, 6)), ((7, 3), (3,)), ((2, 1000), (1000,)),
                 ((4, 1), (1,))]:
    add(OpCase(f"layer_norm/edge/{_sid(_sh)}", lambda e, x, w, b, ns=_ns: e.layer_norm(x, ns, w, b, eps=1e-5),
               lambda np, x, w, b, ns=_ns: ((x - x.mean(tuple(range(-len(ns), 0)), keepdims=True, dtype=np.float64))
                                           / np.sqrt(x.var(tuple(range(-len(ns), 0)), keepdims=True, dtype=np.float64) + 1e-5)
                                           * w + b), [S(_sh, F, -3.0, 5.0), S(_ns, F), S(_ns, F)], 1e-5, 1e-5))
for _sh in [(4, 3), (2, 3, 5, 7), (1, 5, 9), (2, 4, 1, 1)]:
    _c = _sh[1]
    add(OpCase(f"batch_norm/edge/{_sid(_sh)}", lambda e, x, m, v, w, b: e.batch_norm(x, m, v, w, b),
               lambda np, x, m, v, w, b: _np_batch_norm(np, x, m, v, w, b),
               [S(_sh, F), S((_c,), F), S((_c,), F, 0.1, 2.0), S((_c,), F), S((_c,), F)], 1e-5, 1e-5))
for _sh, _ax in [((2, 300), 1), ((300, 3), 0), ((3, 17, 5), 1)]:
    for _ex, _rv in ((False, False), (True, True)):
        add(OpCase(f"cumsum/edge/{_sid(_sh)}/axis{_ax}/ex{int(_ex)}rv{int(_rv)}",
                   lambda e, x, a=_ax, ex=_ex, rv=_rv: e.cumsum(x, a, exclusive=ex, reverse=rv),
                   lambda np, x, a=_ax, ex=_ex, rv=_rv: _np_cumsum(np, x, a, ex, rv), [S(_sh, F)], 1e-5, 1e-5))


# ---- error cases --------------------------------------------------------------------------------

def _err(cid, fn, specs, exc, *match):
    add(OpCase(cid, fn, None, specs, raises=exc, match=match))


_err("conv2d/err/channels", lambda e, x, w: e.conv2d(x, w), [S((1, 3, 8, 8)), S((8, 4, 3, 3))], "ShapeError",
     "conv2d", "3 channels", "expects 4", "(1, 3, 8, 8)", "(8, 4, 3, 3)")
_err("conv2d/err/kernel_too_big", lambda e, x, w: e.conv2d(x, w), [S((1, 1, 2, 2)), S((1, 1, 3, 3))], "ShapeError",
     "conv2d", "larger", "(1, 1, 2, 2)")
_err("conv2d/err/dilated_too_big", lambda e, x, w: e.conv2d(x, w, padding=1, dilation=3),
     [S((1, 1, 4, 4)), S((1, 1, 3, 3))], "ShapeError", "conv2d", "dilation 3")
_err("conv2d/err/groups", lambda e, x, w: e.conv2d(x, w, groups=2), [S((1, 4, 5, 5)), S((3, 2, 3, 3))], "ShapeError",
     "conv2d", "groups=2")
_err("conv2d/err/bias", lambda e, x, w, b: e.conv2d(x, w, b), [S((1, 2, 5, 5)), S((3, 2, 3, 3)), S((2,))],
     "ShapeError", "conv2d", "bias", "(3,)")
_err("conv2d/err/weight_rank", lambda e, x, w: e.conv2d(x, w), [S((1, 2, 5, 5)), S((3, 2, 3))], "ShapeError",
     "conv2d", "weight must be 4-D")
_err("conv2d/err/input_rank", lambda e, x, w: e.conv2d(x, w), [S((2, 5, 5, 1, 1)), S((3, 2, 3, 3))], "ShapeError",
     "conv2d", "4-D")
_err("conv2d/err/stride0", lambda e, x, w: e.conv2d(x, w, stride=0), [S((1, 2, 5, 5)), S((3, 2, 3, 3))],
     "ShapeError", "conv2d", "stride")
_err("conv2d/err/negative_padding", lambda e, x, w: e.conv2d(x, w, padding=-1), [S((1, 2, 5, 5)), S((3, 2, 3, 3))],
     "ShapeError", "conv2d", "padding")
_err("conv2d/err/padding_word", lambda e, x, w: e.conv2d(x, w, padding="full"), [S((1, 2, 5, 5)), S((3, 2, 3, 3))],
     "ShapeError", "conv2d", "'full'")
_err("conv2d/err/int", lambda e, x, w: e.conv2d(x, w), [S((1, 2, 5, 5), "int64"), S((3, 2, 3, 3), "int64")],
     "DTypeError", "conv2d", "int64")
_err("conv_transpose2d/err/negative_output", lambda e, x, w: e.conv_transpose2d(x, w, padding=1),
     [S((1, 1, 1, 1)), S((1, 1, 1, 1))], "ShapeError", "conv_transpose2d", "would be -1")
_err("conv_transpose2d/err/output_padding", lambda e, x, w: e.conv_transpose2d(x, w, stride=2, output_padding=2),
     [S((1, 1, 3, 3)), S((1, 1, 3, 3))], "ShapeError", "conv_transpose2d", "output_padding 2")
_err("conv_transpose2d/err/channels", lambda e, x, w: e.conv_transpose2d(x, w), [S((1, 3, 3, 3)), S((2, 1, 3, 3))],
     "ShapeError", "conv_transpose2d", "3 channels", "(2, 1, 3, 3)")
_err("conv_transpose2d/err/groups", lambda e, x, w: e.conv_transpose2d(x, w, groups=2), [S((1, 3, 3, 3)), S((3, 1, 3, 3))],
     "ShapeError", "conv_transpose2d", "groups=2")
_err("max_pool2d/err/kernel0", lambda e, x: e.max_pool2d(x, 0), [S((1, 1, 4, 4))], "ShapeError", "max_pool2d",
     "kernel_size")
_err("max_pool2d/err/too_big", lambda e, x: e.max_pool2d(x, 5), [S((1, 1, 4, 4))], "ShapeError", "max_pool2d",
     "larger", "(1, 1, 4, 4)")
_err("max_pool2d/err/padding", lambda e, x: e.max_pool2d(x, 2, padding=2), [S((1, 1, 4, 4))], "ShapeError",
     "max_pool2d", "half")
_err("max_pool2d/err/rank", lambda e, x: e.max_pool2d(x, 2), [S((4, 4))], "ShapeError", "max_pool2d", "(4, 4)")
_err("max_pool2d/err/bool", lambda e, x: e.max_pool2d(x, 2), [S((1, 1, 4, 4), "bool")], "DTypeError", "max_pool2d")
_err("avg_pool2d/err/int", lambda e, x: e.avg_pool2d(x, 2), [S((1, 1, 4, 4), "int32")], "DTypeError", "avg_pool2d",
     "int32")
_err("avg_pool2d/err/stride", lambda e, x: e.avg_pool2d(x, 2, stride=(1, -1)), [S((1, 1, 4, 4))], "ShapeError",
     "avg_pool2d", "stride")
_err("adaptive_avg_pool2d/err/zero", lambda e, x: e.adaptive_avg_pool2d(x, (0, 2)), [S((1, 1, 4, 4))], "ShapeError",
     "adaptive_avg_pool2d", "positive")
_err("batch_norm/err/channels", lambda e, x, m, v: e.batch_norm(x, m, v), [S((2, 3, 2, 2)), S((4,)), S((3,))],
     "ShapeError", "batch_norm", "running_mean", "(3,)", "(4,)")
_err("batch_norm/err/rank", lambda e, x, m, v: e.batch_norm(x, m, v), [S((3,)), S((3,)), S((3,))], "ShapeError",
     "batch_norm", "(3,)")
_err("layer_norm/err/shape", lambda e, x: e.layer_norm(x, (3, 4)), [S((2, 4, 3))], "ShapeError", "layer_norm",
     "(3, 4)", "(2, 4, 3)")
_err("layer_norm/err/weight", lambda e, x, w: e.layer_norm(x, 3, w), [S((2, 3)), S((2,))], "ShapeError", "layer_norm",
     "weight")
_err("sdpa/err/features", lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v),
     [S((1, 3, 4)), S((1, 5, 3)), S((1, 5, 2))], "ShapeError", "scaled_dot_product_attention", "(1, 3, 4)", "(1, 5, 3)")
_err("sdpa/err/length", lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v),
     [S((1, 3, 4)), S((1, 5, 4)), S((1, 6, 2))], "ShapeError", "scaled_dot_product_attention", "(1, 6, 2)")
_err("sdpa/err/mask", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m),
     [S((1, 3, 4)), S((1, 5, 4)), S((1, 5, 2)), S((3, 4), "bool")], "ShapeError", "attn_mask", "(3, 4)")
_err("sdpa/err/mask_dtype", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m),
     [S((1, 3, 4)), S((1, 5, 4)), S((1, 5, 2)), S((3, 5), "int32")], "DTypeError", "attn_mask", "int32")
_err("sdpa/err/causal_and_mask", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m, is_causal=True),
     [S((1, 3, 4)), S((1, 5, 4)), S((1, 5, 2)), S((3, 5), "bool")], "ShapeError", "is_causal")
_err("embedding/err/float_indices", lambda e, i, w: e.embedding(i, w), [S((3,)), S((4, 2))], "DTypeError",
     "embedding", "float32")
_err("embedding/err/weight_rank", lambda e, i, w: e.embedding(i, w), [S((3,), "int64", 0, 2), S((4,))], "ShapeError",
     "embedding", "(4,)")
_err("embedding/err/out_of_range", lambda e, i, w: e.embedding(i, w), [S((3,), "int64", values=[0, 4, 1]), S((4, 2))],
     "IndexingError", "embedding", "4", "(4, 2)")
_err("softmax/err/axis", lambda e, x: e.softmax(x, axis=2), [S((2, 3))], "ShapeError", "softmax", "axis 2")
_err("gelu/err/approximate", lambda e, x: e.gelu(x, approximate="sigmoid"), [S((2,))], "UnsupportedOp", "gelu",
     "'sigmoid'")
_err("cumsum/err/axis", lambda e, x: e.cumsum(x, 2), [S((2, 3))], "ShapeError", "cumsum", "axis 2")
_err("cumsum/err/no_axis", lambda e, x: e.cumsum(x), [S((2, 3))], "ShapeError", "cumsum", "rank 2")
_err("sort/err/axis", lambda e, x: e.sort(x, axis=-3), [S((2, 3))], "ShapeError", "sort", "axis -3")
_err("topk/err/k", lambda e, x: e.topk(x, 4), [S((2, 3))], "ShapeError", "topk", "k=4", "(2, 3)")
_err("topk/err/negative_k", lambda e, x: e.topk(x, -1), [S((2, 3))], "ShapeError", "topk", "k=-1")
_err("pad/err/crop", lambda e, x: e.pad(x, [(-2, -2)]), [S((3,))], "ShapeError", "pad", "axis 0", "(3,)")
_err("pad/err/reflect_empty", lambda e, x: e.pad(x, [(0, 0), (1, 1)], mode="reflect"), [S((2, 0))], "ShapeError",
     "pad", "'reflect'", "axis 1")
_err("pad/err/width_count", lambda e, x: e.pad(x, [(1, 1), (1, 1), (1, 1)]), [S((2, 3))], "ShapeError", "pad",
     "(2, 3)")
_err("pad/err/mode", lambda e, x: e.pad(x, 1, mode="symmetric"), [S((2, 3))], "UnsupportedOp", "pad", "'symmetric'")
_err("pad/err/value", lambda e, x: e.pad(x, 1, value="zero"), [S((2, 3))], "DTypeError", "pad", "str")


# ---- linear, and GEMM / conv / pool edge shapes (the wasm SIMD kernels' tile edges and paths) ----
# linear is x @ weight.T + bias with weight (out, in). The shapes reach every path of the wasm
# kernels: at most 16 rows (dot products / B read in place) and more (packed panels), ragged 4x8
# tiles, K past one 256-deep block, one and many batches, broadcasting, NaN/inf, float16.

def _np_linear(np, x, w, b=None):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return (y if b is None else y + b).astype(np.result_type(x, w) if b is None else np.result_type(x, w, b))


_LIN = [((5,), 3), ((3, 7), 4), ((2, 3, 7), 5), ((1, 1), 1), ((16, 9), 13), ((17, 9), 13), ((20, 33), 8),
        ((4, 600), 7), ((40, 300), 19), ((2, 2, 17, 12), 9), ((1, 1568), 64)]
for _xs, _n in _LIN:
    _tol = (1e-4, 1e-4) if _xs[-1] > 100 else (1e-5, 1e-5)
    _id = f"linear/{_sid(_xs)}_out{_n}"
    add(OpCase(_id, lambda e, x, w, b: e.linear(x, w, b), _np_linear, [S(_xs), S((_n, _xs[-1])), S((_n,))], *_tol))
    add(OpCase(_id + "/nobias", lambda e, x, w: e.linear(x, w), _np_linear, [S(_xs), S((_n, _xs[-1]))], *_tol))
add(OpCase("linear/empty_rows", lambda e, x, w, b: e.linear(x, w, b), _np_linear, [S((0, 4)), S((3, 4)), S((3,))]))
add(OpCase("linear/k0", lambda e, x, w, b: e.linear(x, w, b), lambda np, x, w, b: np.zeros((3, 2), np.float32) + b,
           [S((3, 0)), S((2, 0)), S((2,))]))
add(OpCase("linear/k0/nobias", lambda e, x, w: e.linear(x, w), lambda np, x, w: np.zeros((3, 2), np.float32),
           [S((3, 0)), S((2, 0))]))
for _m in (3, 20):
    add(OpCase(f"linear/special/{_m}rows", lambda e, x, w, b: e.linear(x, w, b), _np_linear,
               [S((_m, 6), special=True), S((5, 6)), S((5,))]))
    add(OpCase(f"linear/f16/{_m}rows", lambda e, x, w, b: e.linear(x, w, b),
               lambda np, x, w, b: _np_linear(np, x.astype(np.float32), w.astype(np.float32), b).astype(np.float16),
               [S((_m, 10), H), S((6, 10), H), S((6,), H)], dtype=H))
add(OpCase("linear/f16_x/f32_w", lambda e, x, w: e.linear(x, w), lambda np, x, w: _np_linear(np, x.astype(np.float32), w),
           [S((4, 5), H), S((3, 5))]))
_err("linear/err/features", lambda e, x, w: e.linear(x, w), [S((2, 3)), S((4, 5))], "ShapeError", "linear", "(2, 3)", "(4, 5)")
_err("linear/err/bias", lambda e, x, w, b: e.linear(x, w, b), [S((2, 3)), S((4, 3)), S((3,))], "ShapeError", "linear",
     "bias", "(3,)")
_err("linear/err/int", lambda e, x, w: e.linear(x, w), [S((2, 3), "int32"), S((4, 3), "int32")], "DTypeError", "linear")

_MM_EDGE = [((1, 1), (1, 9)), ((9, 1), (1, 1)), ((1, 300), (300, 1)), ((5, 9), (9, 11)), ((17, 3), (3, 9)),
            ((33, 257), (257, 15)), ((4, 513), (513, 7)), ((100, 8), (8, 8)), ((2, 1, 20, 5), (3, 5, 9)),
            ((3, 20, 5), (5, 9)), ((20, 5), (3, 5, 9)), ((2, 3, 4, 5), (2, 3, 5, 17))]
for _a, _b in _MM_EDGE:
    _tol = (1e-4, 1e-4) if _a[-1] > 100 else (1e-5, 1e-5)
    add(OpCase(f"matmul/edge/{_sid(_a)}@{_sid(_b)}", lambda e, a, b: a @ b,
               lambda np, a, b: a.astype(np.float64) @ b.astype(np.float64), [S(_a), S(_b)], *_tol))
add(OpCase("matmul/edge/special_packed", lambda e, a, b: a @ b, lambda np, a, b: a @ b,
           [S((20, 4), special=True), S((4, 9), special=True)]))
add(OpCase("matmul/edge/f16_packed", lambda e, a, b: a @ b,
           lambda np, a, b: (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16), [S((20, 6), H), S((6, 10), H)],
           dtype=H))


def _np_conv2d(np, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)), dil=(1, 1), groups=1):
    """Direct convolution in float64: one tap (ky, kx) at a time, summed over each group's channels."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads[0], pads[1]))
    oh = (xp.shape[2] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (xp.shape[3] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og].astype(np.float64)
        for ky in range(kh):
            for kx in range(kw):
                y0, x0 = ky * dil[0], kx * dil[1]
                patch = xs[:, :, y0:y0 + stride[0] * (oh - 1) + 1:stride[0], x0:x0 + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("ncij,oc->noij", patch, ws[:, :, ky, kx])
    if b is not None:
        out += b.astype(np.float64).reshape(1, o, 1, 1)
    return out.astype(np.result_type(x, w))


def _conv_pads(p):
    return ((p, p), (p, p)) if isinstance(p, int) else p


_CONV = [  # id, x shape, weight shape, stride, padding, dilation, groups
    ("depthwise3x3", (2, 6, 9, 11), (6, 1, 3, 3), 1, 1, 1, 6),
    ("depthwise_mult2", (1, 3, 8, 7), (6, 1, 3, 3), 1, 1, 1, 3),
    ("depthwise_s2_d2", (1, 4, 13, 12), (4, 1, 3, 3), 2, 2, 2, 4),
    ("depthwise_5x5_wide", (1, 2, 6, 23), (2, 1, 5, 5), 1, 2, 1, 2),
    ("depthwise_s3_asym", (1, 3, 10, 11), (3, 1, 2, 4), (3, 2), ((1, 0), (2, 1)), 1, 3),
    ("pointwise", (2, 20, 5, 7), (24, 20, 1, 1), 1, 0, 1, 1),
    ("pointwise_groups", (1, 8, 6, 6), (6, 4, 1, 1), 1, 0, 1, 2),
    ("pointwise_s2", (1, 5, 7, 9), (3, 5, 1, 1), 2, 0, 1, 1),
    ("pointwise_pad", (1, 3, 4, 5), (4, 3, 1, 1), 1, 1, 1, 1),
    ("groups2_s21", (2, 4, 7, 9), (6, 2, 3, 3), (2, 1), 1, 1, 2),
    ("dilation12", (1, 3, 9, 10), (5, 3, 3, 2), 1, (1, 2), (1, 2), 1),
    ("asym_pads", (1, 2, 6, 7), (3, 2, 3, 3), 1, ((1, 0), (2, 1)), 1, 1),
    ("deep_k288", (1, 32, 6, 6), (20, 32, 3, 3), 1, 1, 1, 1),
    ("wide_rows_17", (1, 3, 5, 30), (17, 3, 3, 3), 1, 1, 1, 1),
    ("big_kernel_s3", (1, 3, 20, 19), (5, 3, 7, 7), 3, 3, 1, 1),
    ("many_positions", (1, 1, 180, 170), (2, 1, 3, 3), 1, 1, 1, 1),
    ("one_pixel", (3, 4, 1, 1), (5, 4, 1, 1), 1, 0, 1, 1),
    ("k_equals_input", (1, 2, 3, 3), (4, 2, 3, 3), 1, 0, 1, 1),
    # >= 32 output channels, groups 1: webgpu runs these as a matmul (over im2col columns)
    ("mm_3x3", (2, 5, 6, 7), (32, 5, 3, 3), 1, 1, 1, 1),
    ("mm_1x1", (2, 8, 5, 6), (33, 8, 1, 1), 1, 0, 1, 1),
    ("mm_asym_dil_s12", (1, 3, 9, 8), (32, 3, 3, 2), (1, 2), ((1, 0), (2, 1)), (2, 1), 1),
]
for _cid, _xs, _ws, _s, _p, _d, _g in _CONV:
    _st = (_s, _s) if isinstance(_s, int) else _s
    _di = (_d, _d) if isinstance(_d, int) else _d
    _pp = _conv_pads(_p) if not (isinstance(_p, tuple) and isinstance(_p[0], int)) else ((_p[0], _p[0]), (_p[1], _p[1]))
    _tol = (1e-4, 1e-4) if _ws[1] * _ws[2] * _ws[3] > 100 else (1e-5, 1e-5)
    add(OpCase(f"conv2d/edge/{_cid}", lambda e, x, w, b, s=_s, p=_p, d=_d, g=_g: e.conv2d(x, w, b, s, p, d, g),
               lambda np, x, w, b, s=_st, p=_pp, d=_di, g=_g: _np_conv2d(np, x, w, b, s, p, d, g),
               [S(_xs), S(_ws), S(_ws[:1])], *_tol))
add(OpCase("conv2d/edge/nobias", lambda e, x, w: e.conv2d(x, w, padding=1),
           lambda np, x, w: _np_conv2d(np, x, w, None, (1, 1), ((1, 1), (1, 1))), [S((1, 3, 6, 6)), S((4, 3, 3, 3))]))
add(OpCase("conv2d/edge/depthwise_nobias", lambda e, x, w: e.conv2d(x, w, padding=1, groups=3),
           lambda np, x, w: _np_conv2d(np, x, w, None, (1, 1), ((1, 1), (1, 1)), groups=3), [S((1, 3, 6, 6)), S((3, 1, 3, 3))]))
add(OpCase("conv2d/edge/special", lambda e, x, w, b: e.conv2d(x, w, b, padding=1),
           lambda np, x, w, b: _np_conv2d(np, x, w, b, (1, 1), ((1, 1), (1, 1))),
           [S((1, 2, 5, 5), special=True), S((3, 2, 3, 3)), S((3,))]))
add(OpCase("conv2d/edge/depthwise_special", lambda e, x, w: e.conv2d(x, w, padding=1, groups=2),
           lambda np, x, w: _np_conv2d(np, x, w, None, (1, 1), ((1, 1), (1, 1)), groups=2),
           [S((1, 2, 5, 5), special=True), S((2, 1, 3, 3))]))
add(OpCase("conv2d/edge/f16_pointwise", lambda e, x, w, b: e.conv2d(x, w, b),
           lambda np, x, w, b: _np_conv2d(np, x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)).astype(np.float16),
           [S((1, 6, 4, 4), H), S((5, 6, 1, 1), H), S((5,), H)], 1e-2, 1e-2, dtype=H))


def _np_pool(np, x, k, s, pads, dil, ceil_mode, kind, include_pad=True):
    """Max / average pooling in float64 by windows, with PyTorch's output size and divisors."""
    n, c, h, w = x.shape
    sizes = []
    for size, kk, ss, (p0, p1), dd in zip((h, w), k, s, pads, dil):
        eff = dd * (kk - 1) + 1
        span = size + p0 + p1 - eff
        o = (span + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= size + p0:
            o -= 1
        sizes.append(o)
    oh, ow = sizes
    xf = x.astype(np.float64)
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * s[0] - pads[0][0], j * s[1] - pads[1][0]
            ys = [y for y in range(y0, y0 + dil[0] * k[0], dil[0]) if 0 <= y < h]
            xs = [v for v in range(x0, x0 + dil[1] * k[1], dil[1]) if 0 <= v < w]
            win = xf[:, :, ys][:, :, :, xs].reshape(n, c, -1)
            if kind == "max":
                out[:, :, i, j] = win.max(axis=-1) if win.shape[-1] else -np.inf
            else:
                if include_pad:
                    cnt = (min(y0 + k[0], h + pads[0][1]) - y0) * (min(x0 + k[1], w + pads[1][1]) - x0)
                else:
                    cnt = len(ys) * len(xs)
                out[:, :, i, j] = win.sum(axis=-1) / cnt
    return out.astype(x.dtype)


_POOL = [  # id, x shape, kernel, stride, padding, dilation, ceil_mode
    ("2x2_odd", (2, 3, 9, 11), 2, 2, 0, 1, False),
    ("2x2_odd_ceil", (1, 2, 9, 11), 2, 2, 0, 1, True),
    ("2x2_wide", (1, 2, 4, 37), 2, 2, 0, 1, False),
    ("3x3_s1_p1", (1, 2, 7, 8), 3, 1, 1, 1, False),
    ("3x3_s2_p1_ceil", (1, 3, 10, 9), 3, 2, 1, 1, True),
    ("2x3_s12", (1, 2, 6, 9), (2, 3), (1, 2), (1, 1), 1, False),
    ("3x3_dilated", (1, 2, 10, 10), 3, 1, 1, 2, False),
    ("4x4_s3_p2_ceil", (1, 1, 11, 13), 4, 3, 2, 1, True),
]
for _pid, _xs, _k, _s, _p, _d, _cm in _POOL:
    _kk = (_k, _k) if isinstance(_k, int) else _k
    _ss = (_s, _s) if isinstance(_s, int) else _s
    _pp = ((_p, _p), (_p, _p)) if isinstance(_p, int) else ((_p[0], _p[0]), (_p[1], _p[1]))
    _dd = (_d, _d) if isinstance(_d, int) else _d
    add(OpCase(f"max_pool2d/edge/{_pid}", lambda e, x, k=_k, s=_s, p=_p, d=_d, cm=_cm: e.max_pool2d(x, k, s, p, d, cm),
               lambda np, x, k=_kk, s=_ss, p=_pp, d=_dd, cm=_cm: _np_pool(np, x, k, s, p, d, cm, "max"), [S(_xs)]))
    if _d == 1:
        for _cip in (True, False):
            add(OpCase(f"avg_pool2d/edge/{_pid}/pad{int(_cip)}",
                       lambda e, x, k=_k, s=_s, p=_p, cm=_cm, ci=_cip: e.avg_pool2d(x, k, s, p, cm, ci),
                       lambda np, x, k=_kk, s=_ss, p=_pp, cm=_cm, ci=_cip: _np_pool(np, x, k, s, p, (1, 1), cm, "avg", ci),
                       [S(_xs)]))
for _k, _p in ((2, 0), (3, 1)):
    add(OpCase(f"max_pool2d/edge/special_k{_k}", lambda e, x, k=_k, p=_p: e.max_pool2d(x, k, 2, p),
               lambda np, x, k=_k, p=_p: _np_pool(np, x, (k, k), (2, 2), ((p, p), (p, p)), (1, 1), False, "max"),
               [S((1, 2, 8, 10), special=True)]))
    add(OpCase(f"avg_pool2d/edge/special_k{_k}", lambda e, x, k=_k, p=_p: e.avg_pool2d(x, k, 2, p),
               lambda np, x, k=_k, p=_p: _np_pool(np, x, (k, k), (2, 2), ((p, p), (p, p)), (1, 1), False, "avg"),
               [S((1, 2, 8, 10), special=True)]))
add(OpCase("max_pool2d/edge/f16", lambda e, x: e.max_pool2d(x, 2),
           lambda np, x: _np_pool(np, x, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), False, "max"), [S((1, 2, 6, 6), H)],
           dtype=H))
add(OpCase("avg_pool2d/edge/f16", lambda e, x: e.avg_pool2d(x, 3, 2, 1),
           lambda np, x: _np_pool(np, x.astype(np.float32), (3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False, "avg")
           .astype(np.float16), [S((1, 2, 7, 7), H)], dtype=H))
add(OpCase("max_pool2d/edge/int32", lambda e, x: e.max_pool2d(x, 2),
           lambda np, x: _np_pool(np, x, (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), False, "max"), [S((1, 1, 4, 6), "int32")]))


# ---- scaled_dot_product_attention shapes (the wasm fused kernel: few / many query rows, masks
# broadcast as a BERT padding mask, rows with every key masked, batch broadcasting) -------------

def _np_sdpa(np, q, k, v, mask=None, causal=False, scale=None):
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q64 @ np.swapaxes(k64, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    m = s.max(axis=-1, keepdims=True)
    dead = m == -np.inf
    with np.errstate(invalid="ignore"):
        e = np.exp(s - np.where(dead, 0.0, m))
        p = e / np.where(dead, 1.0, e.sum(axis=-1, keepdims=True))
    return (p @ v64).astype(np.result_type(q, k, v))


_SDPA = [  # id, q, k, v, mask (shape, dtype) or None, causal
    ("many_rows", (2, 3, 20, 8), (2, 3, 19, 8), (2, 3, 19, 12), None, False),
    ("many_rows_causal", (1, 2, 24, 5), (1, 2, 24, 5), (1, 2, 24, 7), None, True),
    ("bert_mask", (2, 4, 9, 6), (2, 4, 9, 6), (2, 4, 9, 6), ((2, 1, 1, 9), "bool"), False),
    ("bert_mask_many", (2, 2, 18, 4), (2, 2, 18, 4), (2, 2, 18, 4), ((2, 1, 1, 18), "bool"), False),
    ("float_mask_rows", (1, 2, 5, 3), (1, 2, 7, 3), (1, 2, 7, 2), ((5, 1), "float32"), False),
    ("kv_broadcast", (3, 2, 4, 6), (1, 2, 10, 6), (2, 10, 9), None, False),
    ("one_query", (2, 1, 16), (2, 33, 16), (2, 33, 17), None, False),
    ("one_key", (4, 3), (1, 3), (1, 5), None, False),
]
for _sid_, _q, _k, _v, _m, _c in _SDPA:
    _specs = [S(_q), S(_k), S(_v)]
    if _m is not None:
        _specs.append(S(_m[0], _m[1]) if _m[1] == "bool" else S(_m[0], _m[1], -2.0, 2.0))
        add(OpCase(f"sdpa/shape/{_sid_}", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m),
                   lambda np, q, k, v, m: _np_sdpa(np, q, k, v, m), _specs, 1e-5, 1e-5))
    else:
        add(OpCase(f"sdpa/shape/{_sid_}", lambda e, q, k, v, c=_c: e.scaled_dot_product_attention(q, k, v, is_causal=c),
                   lambda np, q, k, v, c=_c: _np_sdpa(np, q, k, v, causal=c), _specs, 1e-5, 1e-5))
# a query row whose keys are all masked gives zeros; NaN in the scores gives a NaN row
add(OpCase("sdpa/shape/dead_rows", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m),
           lambda np, q, k, v, m: _np_sdpa(np, q, k, v, m),
           [S((1, 3, 4)), S((1, 5, 4)), S((1, 5, 2)), S((3, 5), "bool", values=[0] * 5 + [1, 0, 1, 0, 0] + [0] * 4 + [1])]))
add(OpCase("sdpa/shape/dead_rows_many", lambda e, q, k, v, m: e.scaled_dot_product_attention(q, k, v, m),
           lambda np, q, k, v, m: _np_sdpa(np, q, k, v, m),
           [S((1, 20, 4)), S((1, 6, 4)), S((1, 6, 3)), S((20, 1), "bool", values=[1, 0] * 10)]))
add(OpCase("sdpa/shape/special", lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v),
           lambda np, q, k, v: _np_sdpa(np, q, k, v), [S((1, 4, 3), special=True), S((1, 5, 3)), S((1, 5, 2))]))
add(OpCase("sdpa/shape/scale_f16", lambda e, q, k, v: e.scaled_dot_product_attention(q, k, v, scale=0.3),
           lambda np, q, k, v: _np_sdpa(np, q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                        scale=0.3).astype(np.float16),
           [S((2, 18, 4), H), S((2, 7, 4), H), S((2, 7, 5), H)], 1e-2, 1e-2, dtype=H))   # decompositions round each step


# ---- conv_transpose2d shapes (the wasm GEMM + col2im kernel: groups, strides, dilation,
# output_padding, asymmetric padding, input positions in several chunks) --------------------------

def _np_conv_transpose2d(np, x, w, b=None, stride=(1, 1), pads=((0, 0), (0, 0)), outpad=(0, 0), dil=(1, 1), groups=1):
    """Scatter every input pixel times its kernel into the full output, then crop the padding."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    cg = c // groups
    fh = (h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + outpad[0]
    fw = (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + outpad[1]
    full = np.zeros((n, og * groups, fh + pads[0][1], fw + pads[1][1]))
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    for g in range(groups):
        for ky in range(kh):
            for kx in range(kw):
                contrib = np.einsum("ncij,co->noij", x64[:, g * cg:(g + 1) * cg], w64[g * cg:(g + 1) * cg, :, ky, kx])
                y0, x0 = ky * dil[0], kx * dil[1]
                full[:, g * og:(g + 1) * og, y0:y0 + stride[0] * (h - 1) + 1:stride[0],
                     x0:x0 + stride[1] * (wd - 1) + 1:stride[1]] += contrib
    out = full[:, :, pads[0][0]:fh - pads[0][1], pads[1][0]:fw - pads[1][1]]
    if b is not None:
        out = out + b.astype(np.float64).reshape(1, -1, 1, 1)
    return out.astype(np.result_type(x, w))


_CONVT = [  # id, x, weight (c, og, kh, kw), stride, padding ((t, b), (l, r)), output_padding, dilation, groups
    ("s2_op1", (2, 3, 5, 4), (3, 4, 3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),
    ("groups2_s21", (1, 4, 4, 6), (4, 3, 2, 3), (2, 1), ((0, 0), (1, 1)), (0, 0), (1, 1), 2),
    ("dilated", (1, 2, 5, 5), (2, 3, 3, 3), (1, 1), ((2, 2), (1, 1)), (0, 0), (2, 2), 1),
    ("asym_pads", (1, 2, 4, 5), (2, 2, 3, 3), (2, 2), ((1, 0), (0, 2)), (1, 0), (1, 1), 1),
    ("deep_c40", (1, 40, 3, 3), (40, 5, 2, 2), (2, 2), ((0, 0), (0, 0)), (0, 0), (1, 1), 1),
    ("chunks", (1, 1, 90, 91), (1, 4, 3, 3), (1, 1), ((1, 1), (1, 1)), (0, 0), (1, 1), 1),
    # stride 1, >= 32 output channels: webgpu runs it as conv2d (flipped kernel) on the matmul
    ("mm_s1", (2, 3, 5, 4), (3, 32, 3, 3), (1, 1), ((1, 1), (0, 0)), (0, 0), (1, 1), 1),
    ("mm_s1_dil_op", (1, 2, 4, 5), (2, 34, 3, 2), (1, 1), ((1, 1), (0, 0)), (1, 0), (2, 1), 1),
]
for _tid, _xs, _ws, _s, _p, _op, _d, _g in _CONVT:
    add(OpCase(f"conv_transpose2d/edge/{_tid}",
               lambda e, x, w, b, s=_s, p=_p, op=_op, d=_d, g=_g: e.conv_transpose2d(x, w, b, s, p, op, g, d),
               lambda np, x, w, b, s=_s, p=_p, op=_op, d=_d, g=_g: _np_conv_transpose2d(np, x, w, b, s, p, op, d, g),
               [S(_xs), S(_ws), S((_ws[1] * _g,))], 1e-4, 1e-4))
add(OpCase("conv_transpose2d/edge/nobias_special", lambda e, x, w: e.conv_transpose2d(x, w, stride=2),
           lambda np, x, w: _np_conv_transpose2d(np, x, w, None, (2, 2)), [S((1, 2, 3, 3), special=True), S((2, 2, 2, 2))]))
