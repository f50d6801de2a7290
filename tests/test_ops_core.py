"""Every core op case in ``op_cases.CASES`` against numpy on every backend, plus hypothesis
tests of broadcasting, reductions and layout ops over random shapes (25 examples each,
derandomized so that runs repeat)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import check, check_arrays
from op_cases import CASES

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_case(case, device):
    check(case, device)


def _arrays(shapes, dtype="float32", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        if dtype == "bool":
            out.append(rng.random(s) < 0.5)
        elif dtype.startswith("float"):
            out.append(rng.uniform(-3, 3, s).astype(dtype))
        else:
            out.append(rng.integers(-5 if dtype != "uint8" else 0, 6, s).astype(dtype))
    return out


BINARY = {
    "add": (lambda e, a, b: a + b, lambda np_, a, b: a + b),
    "subtract": (lambda e, a, b: a - b, lambda np_, a, b: a - b),
    "multiply": (lambda e, a, b: a * b, lambda np_, a, b: a * b),
    "maximum": (lambda e, a, b: e.maximum(a, b), lambda np_, a, b: np.maximum(a, b)),
    "less": (lambda e, a, b: a < b, lambda np_, a, b: a < b),
    "divide": (lambda e, a, b: a / (b * b + 1), lambda np_, a, b: a / (b * b + 1)),
}


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       name=st.sampled_from(sorted(BINARY)), dtype=st.sampled_from(["float32", "int32", "float16"]))
def test_binary_broadcasting(device, shapes, name, dtype):
    if name == "divide" and dtype == "float16":
        dtype = "float32"
    e_fn, n_fn = BINARY[name]
    check_arrays(e_fn, n_fn, _arrays(shapes.input_shapes, dtype), device, id=f"{name}{shapes.input_shapes}",
                 dtype=None if name != "divide" or dtype != "int32" else "float32")


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
def test_where_broadcasting(device, shapes):
    c, a, b = shapes.input_shapes
    arrays = _arrays([c], "bool") + _arrays([a, b], seed=1)
    check_arrays(lambda e, c_, a_, b_: e.where(c_, a_, b_), lambda np_, c_, a_, b_: np.where(c_, a_, b_), arrays,
                 device, id=f"where{shapes.input_shapes}")


@st.composite
def shape_and_axes(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4))
    axes = draw(st.one_of(st.none(), st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True, max_size=len(shape))
                          .map(tuple)))
    if axes is not None and not shape:
        axes = None
    neg = draw(st.booleans())
    if axes and neg:
        axes = tuple(a - len(shape) for a in axes)
    return shape, axes, draw(st.booleans())


REDUCE = ["sum", "prod", "max", "min", "mean", "var", "any"]


@SETTINGS
@given(case=shape_and_axes(), name=st.sampled_from(REDUCE))
def test_reductions_random_axes(device, case, name):
    shape, axes, keepdims = case
    dtype = "bool" if name == "any" else "float32"
    arrays = _arrays([shape], dtype)
    check_arrays(lambda e, x: getattr(e, name)(x, axis=axes, keepdims=keepdims),
                 lambda np_, x: getattr(np, name)(x, axis=axes, keepdims=keepdims), arrays, device,
                 rtol=1e-5, atol=1e-5, id=f"{name}{shape}{axes}")


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=4), data=st.data())
def test_permute_reshape_flip(device, shape, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    x = _arrays([shape], "int32")
    check_arrays(lambda e, t: e.permute_dims(t, perm), lambda np_, a: np.transpose(a, perm), x, device, id=f"perm{perm}")
    flip_axes = tuple(data.draw(st.lists(st.integers(0, max(len(shape) - 1, 0)), unique=True, max_size=len(shape)))) \
        if shape else None
    check_arrays(lambda e, t: e.flip(t, axis=flip_axes), lambda np_, a: np.flip(a, axis=flip_axes), x, device,
                 id=f"flip{flip_axes}")
    n = int(np.prod(shape))
    new = (n,) if n == 0 else data.draw(st.sampled_from([(n,), (-1, 1), (1, n, 1), (n, -1)]))
    check_arrays(lambda e, t: e.reshape(e.permute_dims(t, perm), new), lambda np_, a: np.transpose(a, perm).reshape(new),
                 x, device, id=f"reshape{new}")


@SETTINGS
@given(b=hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3), m=st.integers(0, 4), k=st.integers(0, 5),
       n=st.integers(0, 4), vec=st.sampled_from(["", "a", "b"]), dtype=st.sampled_from(["float32", "int64", "float16"]))
def test_matmul_random(device, b, m, k, n, vec, dtype):
    a_shape = (k,) if vec == "a" else b + (m, k)
    b_shape = (k,) if vec == "b" else b[1:] + (k, n)
    arrays = _arrays([a_shape, b_shape], dtype)
    nfn = (lambda np_, x, y: x @ y) if dtype != "float16" else (
        lambda np_, x, y: (x.astype(np.float32) @ y.astype(np.float32)).astype(np.float16))
    check_arrays(lambda e, x, y: x @ y, nfn, arrays, device, rtol=1e-5, atol=1e-5, id=f"matmul{a_shape}{b_shape}")


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4), data=st.data())
def test_concat_split_stack(device, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    shapes = [tuple(s if i != axis % len(shape) else sz for i, s in enumerate(shape)) for sz in sizes]
    arrays = _arrays(shapes, "float32")
    check_arrays(lambda e, *xs: e.concat(xs, axis=axis), lambda np_, *xs: np.concatenate(xs, axis=axis), arrays,
                 device, id=f"concat{shapes}{axis}")
    same = _arrays([shape] * len(sizes), "int32")
    check_arrays(lambda e, *xs: e.stack(xs, axis=axis), lambda np_, *xs: np.stack(xs, axis=axis), same, device,
                 id=f"stack{axis}")
    pts = sorted(data.draw(st.lists(st.integers(0, shape[axis]), max_size=3)))
    check_arrays(lambda e, x: e.split(x, pts, axis=axis), lambda np_, x: np.split(x, pts, axis=axis), same[:1], device,
                 id=f"split{pts}")


@SETTINGS
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), data=st.data())
def test_take_and_take_along_axis(device, shape, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    n = shape[axis]
    idx = np.array(data.draw(st.lists(st.integers(-n, n - 1), max_size=5)), dtype=np.int64)
    x = _arrays([shape], "float32")[0]
    check_arrays(lambda e, t, i: e.take(t, i, axis=axis), lambda np_, t, i: np.take(t, i, axis=axis), [x, idx], device,
                 id=f"take{axis}")
    ish = list(shape)
    ish[axis] = data.draw(st.integers(0, 4))
    ish = [1 if data.draw(st.booleans()) and i != axis % len(shape) else s for i, s in enumerate(ish)]
    ind = np.random.default_rng(0).integers(-n, n, ish).astype(np.int64)
    check_arrays(lambda e, t, i: e.take_along_axis(t, i, axis=axis),
                 lambda np_, t, i: np.take_along_axis(t, i, axis=axis), [x, ind], device, id=f"tal{ish}{axis}")
