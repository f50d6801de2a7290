"""dtypes: names, promotion (array API, checked against numpy where the two agree), weak Python
scalars, and every elementwise/reduction op's dtype rule over every dtype."""
import numpy as np
import pytest

import ember
from ember import dtypes
from ember.errors import DTypeError
from helpers import raises

NAMES = ["bool", "uint8", "int32", "int64", "float16", "float32"]


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("b", NAMES)
def test_result_type(a, b):
    got = dtypes.result_type(dtypes.get(a), dtypes.get(b)).name
    assert got == dtypes.result_type(dtypes.get(b), dtypes.get(a)).name  # symmetric
    ka, kb = np.dtype(a).kind, np.dtype(b).kind
    if ka == kb or "b" in (ka, kb) or {ka, kb} == {"u", "i"}:
        # same kind (or bool involved): the array API and numpy agree
        assert got == np.result_type(a, b).name
    else:
        # int with float: the array API leaves it to the library; ember (like PyTorch) keeps the float
        assert got == (a if ka == "f" else b)


@pytest.mark.parametrize("name", NAMES)
def test_get_accepts_names_numpy_and_python_types(name):
    d = dtypes.get(name)
    assert d.name == name and dtypes.get(d) is d and dtypes.get(np.dtype(name)) is d
    assert repr(d) == f"ember.{name}"
    assert d.itemsize == np.dtype(name).itemsize
    import pickle

    assert pickle.loads(pickle.dumps(d)) is d


def test_get_python_types_and_aliases():
    assert dtypes.get(float) is ember.float32 and dtypes.get(int) is ember.int64 and dtypes.get(bool) is ember.bool
    assert dtypes.get("half") is ember.float16 and dtypes.get(np.bool_) is ember.bool
    with raises(DTypeError, "unknown dtype", "complex64"):
        dtypes.get("complex64")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("scalar", [2, 2.5, True])
def test_weak_scalars_match_numpy_in_kind(name, scalar, device):
    """NEP 50 (numpy 2) and the array API: a Python scalar does not widen a tensor of its kind."""
    x = ember.ones((2,), dtype=name, device=device)
    r = (x + scalar) if name != "bool" or isinstance(scalar, bool) is False else (x | scalar)
    np_r = (np.ones(2, dtype=name) + scalar) if name != "bool" or not isinstance(scalar, bool) else (
        np.ones(2, dtype=name) | scalar)
    if isinstance(scalar, float) and np.dtype(name).kind in "biu":
        assert r.dtype is ember.float32  # int tensor + float scalar: default float (numpy: float64)
    else:
        assert r.dtype.name == np_r.dtype.name
    np.testing.assert_allclose(np.asarray(r.tolist(), dtype=np.float64), np_r.astype(np.float64))


def test_scalar_out_of_range_raises():
    with raises(DTypeError, "300", "uint8"):
        ember.tensor([1], dtype="uint8") * 300
    with raises(DTypeError, "int32"):
        ember.tensor([1], dtype="int32") + 2 ** 40
    assert (ember.tensor([1], dtype="int64") + 2 ** 40).tolist() == [2 ** 40 + 1]


FLOAT_MATH = ["exp", "log", "sqrt", "sin", "cos", "tanh", "erf", "reciprocal", "rsqrt"]
NUMERIC_SAME = ["negative", "sign", "floor", "ceil", "round", "square"]


@pytest.mark.parametrize("name", NAMES)
def test_unary_dtype_rules(name):
    x = ember.ones((2,), dtype=name)
    for op in FLOAT_MATH:
        assert getattr(ember, op)(x).dtype.name == (name if name.startswith("float") else "float32"), op
    for op in NUMERIC_SAME:
        if name == "bool":
            with raises(DTypeError, op, "bool"):
                getattr(ember, op)(x)
        else:
            assert getattr(ember, op)(x).dtype.name == name, op
    for op in ("isnan", "isinf", "isfinite"):
        assert getattr(ember, op)(x).dtype is ember.bool
    assert ember.abs(x).dtype.name == name
    if name == "bool":
        assert ember.logical_not(x).dtype is ember.bool
    else:
        with raises(DTypeError, "logical_not", name):
            ember.logical_not(x)


ARITH = ["add", "subtract", "multiply", "floor_divide", "remainder", "pow"]


@pytest.mark.parametrize("a", NAMES)
@pytest.mark.parametrize("b", NAMES)
def test_binary_dtype_rules(a, b):
    x, y = ember.ones((2,), dtype=a), ember.ones((2,), dtype=b)
    p = dtypes.result_type(x.dtype, y.dtype)
    for op in ARITH:
        if a == b == "bool":
            with raises(DTypeError, op, "bool"):
                getattr(ember, op)(x, y)
        else:
            assert getattr(ember, op)(x, y).dtype is p, op
    assert ember.divide(x, y).dtype is (p if p.is_floating else ember.float32)
    for op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
        assert getattr(ember, op)(x, y).dtype is ember.bool
    assert ember.maximum(x, y).dtype is p and ember.minimum(x, y).dtype is p
    for op in ("logical_and", "logical_or", "logical_xor"):
        if a == b == "bool":
            assert getattr(ember, op)(x, y).dtype is ember.bool
        else:
            with raises(DTypeError, op, "bool"):
                getattr(ember, op)(x, y)
    if a != "bool" or b != "bool":
        assert ember.matmul(x, y).dtype is p
    assert ember.concat([x, y]).dtype is p
    assert ember.where(ember.ones((2,), dtype="bool"), x, y).dtype is p


@pytest.mark.parametrize("name", NAMES)
def test_reduction_dtype_rules(name):
    x = ember.ones((2, 3), dtype=name)
    acc = {"bool": "int64", "int8": "int64", "int16": "int64", "int32": "int64"}.get(name, name)
    acc = "uint64" if name.startswith("uint") else acc   # unsigned sums stay unsigned (array API)
    assert x.sum().dtype.name == acc and x.prod().dtype.name == acc
    assert x.max().dtype.name == name and x.min().dtype.name == name
    assert x.argmax().dtype is ember.int64 and x.argmin(axis=0).dtype is ember.int64
    assert x.any().dtype is ember.bool and x.all(axis=1).dtype is ember.bool
    for op in ("mean", "var", "std"):
        if name == "bool":
            with raises(DTypeError, op, "bool"):
                getattr(x, op)()
        else:
            assert getattr(x, op)().dtype.name == (name if name.startswith("float") else "float32")


def test_index_ops_need_integer_indices():
    x = ember.ones((3,))
    with raises(DTypeError, "take", "float32"):
        ember.take(x, ember.ones((1,)))
    with raises(DTypeError, "take_along_axis", "bool"):
        ember.take_along_axis(x, ember.ones((1,), dtype="bool"), axis=0)
    with raises(DTypeError, "clip", "bool"):
        ember.clip(ember.ones((1,), dtype="bool"), 0, 1)


# ---- the array API's other real dtypes (python and numpy backends) -------------------------------

WIDE = ["int8", "int16", "uint16", "uint32", "uint64", "float64"]
STANDARD = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"]


@pytest.mark.parametrize("a", STANDARD)
def test_array_api_promotion_matches_numpy(a):
    # numpy agrees with the standard's table wherever the table defines a result; the
    # int/float and bool/number mixes are ember's (PyTorch-like) choices, tested above
    for b in STANDARD:
        da, db = dtypes.get(a), dtypes.get(b)
        if (da.kind == "f") != (db.kind == "f") or "bool" in (a, b) and a != b:
            continue
        if {da.kind, db.kind} == {"u", "i"} and "uint64" in (a, b):
            with raises(DTypeError, "uint64"):
                dtypes.result_type(da, db)
            continue
        assert dtypes.result_type(da, db).name == np.result_type(a, b).name, (a, b)


@pytest.mark.parametrize("name", WIDE)
def test_wide_dtypes_round_trip_on_cpu_backends(name):
    info = np.iinfo(name) if name != "float64" else None
    vals = [info.min, 0, info.max] if info else [1e300, -2.5, 5e-324]
    for dev in ("python", "numpy"):
        t = ember.tensor(vals, dtype=name, device=dev)
        assert t.dtype.name == name and t.tolist() == np.array(vals, dtype=name).tolist()
        assert (t + t).tolist() == (np.array(vals, dtype=name) + np.array(vals, dtype=name)).tolist()
        assert t.to("numpy" if dev == "python" else "python").tolist() == t.tolist()


@pytest.mark.parametrize("dev", ["webgpu", "wasm"])
def test_wide_dtypes_are_refused_by_name_on_other_devices(dev):
    if dev not in ember.devices():
        pytest.skip(f"{dev} is not available here")
    for name in WIDE:
        with raises(DTypeError, name, dev):
            ember.tensor([1], dtype=name, device=dev)
        with raises(DTypeError, name, dev):
            ember.zeros((2,), dtype=name, device=dev)
        with raises(DTypeError, name, dev):
            ember.tensor([1], dtype=name).to(dev)
        with raises(DTypeError, name, dev):
            ember.ones((2,), device=dev).astype(name)
