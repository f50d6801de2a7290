"""Tensor creation, reading data back, moving between devices, operators and errors."""
import asyncio
import struct

import numpy as np
import pytest

import ember
from ember.errors import DeviceError, DTypeError, IndexingError, ShapeError, UnsupportedOp
from helpers import raises

DTYPES = ["float32", "float16", "int32", "int64", "uint8", "bool"]


def test_tensor_infers_dtype_and_shape(device):
    cases = [([[1, 2], [3, 4]], "int64", (2, 2)), ([1.5, 2], "float32", (2,)), ([True, False], "bool", (2,)),
             (3.5, "float32", ()), (7, "int64", ()), ([], "float32", (0,)), ([[]], "float32", (1, 0)),
             ([True, 2], "int64", (2,))]
    for data, dt, shape in cases:
        t = ember.tensor(data, device=device)
        assert (t.dtype.name, t.shape, t.device) == (dt, shape, device), data
        assert t.tolist() == (np.array(data, dtype=dt).tolist() if shape else data)


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_every_dtype(device, dtype):
    a = (np.arange(-6, 6).reshape(3, 4) * 1.25).astype(dtype) if dtype != "uint8" else np.arange(12, dtype="uint8").reshape(3, 4)
    t = ember.tensor(a, device=device)
    assert t.dtype.name == dtype and t.shape == (3, 4)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.numpy().dtype == a.dtype
    assert t.tolist() == a.tolist()
    assert asyncio.run(t.data_async()) == a.tolist()
    back = ember.from_bytes(t.backend.to_bytes(t._buf, t.shape, t.dtype), t.shape, dtype, device=device)
    assert back.tolist() == a.tolist()


def test_float16_rounds_on_creation(device):
    vals = [0.1, 1 / 3, 65504.0, 70000.0, -1e-8, 2049.0]
    with np.errstate(over="ignore"):
        want = np.array(vals, dtype=np.float16).tolist()
    assert ember.tensor(vals, dtype="float16", device=device).tolist() == want


def test_int_creation_refuses_out_of_range_values(device):
    # data that the dtype cannot hold is a mistake (issue 12); astype is the explicit wrap
    for vals, dt in [([300], "uint8"), ([-1], "uint8"), ([2 ** 31], "int32"), ([2 ** 70], None)]:
        with raises(DTypeError, "out of range"):
            ember.tensor(vals, dtype=dt, device=device)
    assert ember.tensor([256, 300], dtype="int32", device=device).astype("uint8").tolist() == [0, 44]
    assert ember.tensor([1.9, -1.9], dtype="int64", device=device).tolist() == [1, -1]


def test_item_and_scalars(device):
    t = ember.tensor([[2.5]], device=device)
    assert t.item() == 2.5 and float(t) == 2.5 and int(ember.tensor(3, device=device)) == 3
    assert bool(ember.tensor([True], device=device)) is True
    with raises(ShapeError, "item", "(2,)"):
        ember.tensor([1, 2], device=device).item()
    with raises(ShapeError, "item"):
        bool(ember.tensor([1, 2], device=device))
    assert ember.tensor(4, device=device).__index__() == 4
    with pytest.raises(TypeError):
        ember.tensor(4.0, device=device).__index__()


def test_len_iter_repr(device):
    t = ember.arange(6, device=device).reshape((3, 2))
    assert len(t) == 3
    assert [r.tolist() for r in t] == [[0, 1], [2, 3], [4, 5]]
    assert "shape=(3, 2)" in repr(t) and "int64" in repr(t) and repr(device) in repr(t)
    assert "<1000 values>" in repr(ember.zeros((1000,), device=device))
    with pytest.raises(TypeError):
        len(ember.tensor(1.0, device=device))
    with pytest.raises(TypeError):
        list(ember.tensor(1.0, device=device))


def test_tensor_from_nested_numpy_scalars_and_tensors(device):
    t = ember.tensor([np.int64(1), np.int32(2)], device=device)
    assert t.dtype is ember.int64 and t.tolist() == [1, 2]
    assert ember.tensor([np.float32(1.5), 2], device=device).dtype is ember.float32
    rows = [ember.tensor([1.0, 2.0]), np.array([3.0, 4.0])]
    assert ember.tensor(rows, device=device).tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_bad_data_errors():
    with raises(ShapeError, "ragged"):
        ember.tensor([[1, 2], [3]])
    with raises(ShapeError, "ragged"):
        ember.tensor([[1, 2], 3])
    with raises(DTypeError, "str"):
        ember.tensor(["a"])
    with raises(DTypeError, "unknown dtype", "complex64"):
        ember.tensor([1.0], dtype="complex64")
    with raises(ShapeError, "from_bytes", "(2, 2)"):
        ember.from_bytes(b"\0" * 5, (2, 2), "float32")
    with pytest.raises(TypeError):
        ember.Tensor()


def test_np_asarray_of_a_tensor(device):
    t = ember.tensor([[1, 2]], dtype="int32", device=device)
    a = np.asarray(t)
    assert a.dtype == np.int32 and a.tolist() == [[1, 2]]
    assert np.asarray(t, dtype=np.float64).dtype == np.float64


def test_from_numpy_dtypes():
    assert ember.from_numpy(np.zeros(3)).dtype is ember.float32  # float64 -> float32
    assert ember.from_numpy(np.zeros(3, dtype=np.int32)).dtype is ember.int32
    assert ember.from_numpy(np.zeros(3, dtype=bool)).dtype is ember.bool
    x = np.arange(6, dtype=np.float32).reshape(2, 3).T  # non-contiguous input
    np.testing.assert_array_equal(ember.tensor(x).numpy(), x)


def test_to_moves_and_casts(device):
    t = ember.tensor([[1.5, -2.5]], device=device)
    for other in ("python", "numpy"):
        u = t.to(other)
        assert u.device == other and u.tolist() == t.tolist() and u.dtype == t.dtype
    c = t.to(dtype="int32")
    assert c.device == device and c.dtype is ember.int32 and c.tolist() == [[1, -2]]
    assert t.to() is t
    with raises(DeviceError, "nosuch"):
        t.to("nosuch")


def test_mixing_devices_raises():
    a = ember.ones((2,), device="python")
    b = ember.ones((2,), device="numpy")
    with raises(DeviceError, "add", "python", "numpy", ".to("):
        a + b


def test_reshape_is_zero_copy_on_python():
    x = ember.arange(12, device="python")
    y = x.reshape((3, 4))
    assert y._buf is x._buf
    assert y.tolist() == np.arange(12).reshape(3, 4).tolist()


def test_operators_with_python_and_numpy_operands(device):
    x = ember.tensor([1.0, 2.0, 4.0], device=device)
    assert (2 - x).tolist() == [1.0, 0.0, -2.0]
    assert (1 / x).tolist() == [1.0, 0.5, 0.25]
    assert (2 ** x).tolist() == [2.0, 4.0, 16.0]
    assert (7 // x).tolist() == [7.0, 3.0, 1.0]
    assert (7 % x).tolist() == [0.0, 1.0, 3.0]
    r = np.array([1.0, 1.0, 1.0]) + x  # numpy on the left defers to the tensor
    assert isinstance(r, ember.Tensor) and r.tolist() == [2.0, 3.0, 5.0]
    r = np.float32(2) * x
    assert isinstance(r, ember.Tensor) and r.tolist() == [2.0, 4.0, 8.0]
    assert (x + [1, 1, 1]).tolist() == [2.0, 3.0, 5.0]
    assert (-x).tolist() == [-1.0, -2.0, -4.0] and (+x) is x and abs(-x).tolist() == x.tolist()
    assert (x == 2.0).tolist() == [False, True, False]
    assert (x != 2.0).tolist() == [True, False, True]
    assert (3 > x).tolist() == [True, True, False]


def test_eq_with_foreign_objects_and_hash(device):
    x = ember.tensor([1.0], device=device)
    assert (x == None) is False  # noqa: E711 - returns NotImplemented, Python falls back to identity
    assert (x != "a") is True
    assert {x: 1}[x] == 1 and hash(x) == object.__hash__(x)
    with raises(DTypeError, "dict"):
        ember.add(x, {})


def test_bitwise_operators_are_logical_on_bool(device):
    a = ember.tensor([True, True, False, False], device=device)
    b = ember.tensor([True, False, True, False], device=device)
    assert (a & b).tolist() == [True, False, False, False]
    assert (a | b).tolist() == [True, True, True, False]
    assert (a ^ b).tolist() == [False, True, True, False]
    assert (~a).tolist() == [False, False, True, True]
    assert (a & True).tolist() == a.tolist() and (False | b).tolist() == b.tolist()
    # on integers they are the array API's bitwise ops; floats have none
    i, j = ember.tensor([12, -7], device=device), ember.tensor([10, 3], device=device)
    assert [(i & j).tolist(), (i | j).tolist(), (i ^ j).tolist(), (~i).tolist(), (i << 2).tolist(), (i >> 1).tolist()] \
        == [[8, 1], [14, -5], [6, -6], [-13, 6], [48, -28], [6, -4]]
    with raises(DTypeError, "bitwise_and", "float32"):
        ember.tensor([1.0], device=device) & ember.tensor([3.0], device=device)


def test_methods_and_properties(device):
    x = ember.arange(6, device=device).reshape(2, 3)
    assert x.T.shape == (3, 2) and x.mT.tolist() == x.T.tolist()
    assert x.sum(axis=1).tolist() == [3, 12] and x.max().item() == 5
    assert x.astype("float32").mean().item() == 2.5
    assert x.exp().dtype is ember.float32
    assert x.ndim == 2 and x.size == 6 and x.nbytes == 48
    assert "reshape" in dir(x) and "sum" in dir(x)
    with pytest.raises(AttributeError, match="nope"):
        x.nope


def test_immutable():
    x = ember.zeros((2,))
    with raises(UnsupportedOp, "immutable"):
        x[0] = 1.0


def test_creation_functions(device):
    assert ember.zeros((2, 3), device=device).tolist() == np.zeros((2, 3)).tolist()
    assert ember.ones(2, dtype="bool", device=device).tolist() == [True, True]
    assert ember.full((2,), 1.5, dtype="float16", device=device).dtype is ember.float16
    assert ember.full((), 3, device=device).dtype is ember.int64
    x = ember.full((2, 2), 3, dtype="uint8", device=device)
    assert ember.zeros_like(x).dtype is ember.uint8 and ember.zeros_like(x).device == device
    assert ember.arange(5, device=device).device == device
    with raises(ShapeError, "full", "shape"):
        ember.zeros("ab", device=device)
    with raises(DTypeError, "full", "nan"):
        ember.full((2,), float("nan"), dtype="int32", device=device)
    with raises(ShapeError, "linspace"):
        ember.linspace(0, 1, -1)
    with raises(ShapeError, "eye"):
        ember.eye(-1)


def test_python_backend_float16_is_half_precision():
    x = ember.tensor([1.0, 2.0], dtype="float16", device="python")
    y = x / 3
    raw = y.backend.to_bytes(y._buf, y.shape, y.dtype)
    assert struct.unpack("<2e", raw) == tuple(np.array([1 / 3, 2 / 3], dtype=np.float16).tolist())


def test_import_does_not_import_numpy():
    import subprocess
    import sys

    code = ("import sys, ember; x = ember.arange(6).reshape(2, 3); y = (x @ x.T).sum(); x[0, ::-1]; "
            "print('numpy' in sys.modules, 'wgpu' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_bad_device_name():
    with raises(DeviceError, "unknown device", "tpu"):
        ember.zeros((2,), device="tpu")
    with raises(IndexingError, "index 2"):
        ember.zeros((2,))[2]


@pytest.mark.parametrize("module", ["ember", "ember.tensor", "ember.dtypes", "ember.errors", "ember.ops.creation",
                                    "ember.ops.elementwise", "ember.ops.reduction", "ember.ops.movement",
                                    "ember.ops.indexing", "ember.ops.linalg", "ember.backends"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


ALL_DTYPES = ["float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
              "uint64", "bool"]


@pytest.mark.parametrize("shape", [(), (0,), (5,), (1, 4), (1, 0), (3, 2), (2, 1, 3), (2, 0, 3)])
def test_tolist_every_dtype_and_shape_matches_numpy(shape):
    # tolist decodes through array.tolist where the bytes allow (not float16 / bool) and nests
    # 1-d and 1 x n shapes directly: the same values and nesting as numpy's tolist
    rng = np.random.default_rng(len(shape))
    for dtype in ALL_DTYPES:
        if dtype.startswith("float"):
            a = rng.standard_normal(shape).astype(dtype)
            if a.size:
                a.flat[0] = np.nan if a.size > 1 else -0.0
        elif dtype == "bool":
            a = rng.random(shape) > 0.5
        else:
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
            if a.size:
                a.flat[-1] = info.max
        t = ember.from_bytes(a.tobytes(), shape, dtype, device="python")
        got, want = t.tolist(), a.tolist()
        assert repr(got) == repr(want), (dtype, shape)
        assert type(got) is type(want)


def test_from_bytes_copies_mutable_sources(device):
    src = bytearray(np.arange(4, dtype="float32").tobytes())
    t = ember.from_bytes(src, (2, 2), "float32", device=device)
    u = ember.from_bytes(memoryview(src), (4,), "float32", device=device)
    src[:4] = np.float32(9).tobytes()
    assert t.tolist() == [[0.0, 1.0], [2.0, 3.0]] and u.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ShapeError, match="do not hold shape"):
        ember.from_bytes(bytes(12), (2, 2), "float32", device=device)


@pytest.mark.parametrize("dev", ["python", "numpy"])
def test_from_numpy_copies_every_dtype_and_layout(dev):
    # the numpy backend takes the array in one copy (from_array), the others through bytes:
    # the same values, dtypes and independence from the source either way
    rng = np.random.default_rng(3)
    for dtype in ALL_DTYPES:
        a = (rng.standard_normal((3, 4)) * 50).astype(dtype)
        if dtype == "bool":
            a = rng.random((3, 4)) > 0.5
        for src in (a, a.T, a[:, ::2], a[1], np.asarray(a[0, 0]), a.astype(a.dtype.newbyteorder(">"))):
            t = ember.from_numpy(src, device=dev)
            name = "float32" if dtype == "float64" else dtype      # (float64 becomes float32)
            want = np.ascontiguousarray(src).astype(name)
            assert t.dtype.name == name and t.shape == src.shape
            got = t.numpy()
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), (dtype, src.shape)
        b = a.copy()
        t = ember.from_numpy(b, device=dev)
        b[...] = 0
        np.testing.assert_array_equal(t.numpy(), a.astype(t.numpy().dtype))
    t = ember.from_numpy(np.arange(4.0), device=dev, dtype="int32")
    assert t.dtype is ember.int32 and t.tolist() == [0, 1, 2, 3]
    assert ember.from_numpy(np.arange(4.0), device=dev).dtype is ember.float32
