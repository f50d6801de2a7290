"""The wasm backend's ``take`` kernel (``take_x*`` in wasm/kernels/copy.c) against numpy for
every element size and axis, negative indices included; an index out of range is an
``IndexingError`` naming it, called directly and from a replayed command table (the kernel
checks and reports through its i32 result: a guarded command). A compiled llama decode step
replays as one ``ember_run`` call with no Python step."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import ember
from ember.errors import DeviceError, IndexingError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wasm_plan_checks as checks  # noqa: E402


@pytest.fixture(scope="module")
def wasm():
    try:
        return ember.get_backend("wasm")
    except DeviceError as e:
        pytest.skip(f"wasm backend unavailable on this machine: {e}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64", "uint8", "bool"])
def test_take_matches_numpy(wasm, dtype):
    assert "take" in wasm.native
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 5, 4)) * 10).astype(dtype)
    t = ember.tensor(x.tolist(), dtype=dtype, device="wasm")
    for axis in range(3):
        n = x.shape[axis]
        for m in (1, 7):
            idx = rng.integers(-n, n, size=m).astype(np.int32)
            got = ember.take(t, ember.tensor(idx.tolist(), dtype="int32", device="wasm"), axis=axis)
            assert got.shape == np.take(x, idx, axis=axis).shape
            assert np.array_equal(np.array(got.tolist(), dtype=dtype), np.take(x, idx, axis=axis)), (axis, idx)


@pytest.mark.parametrize("bad", [5, -6, 2**31 - 1, -2**31])
def test_an_index_out_of_range_is_a_typed_error(wasm, bad):
    t = ember.ones((2, 5, 3), device="wasm")
    idx = ember.tensor([1, bad, 0], dtype="int32", device="wasm")
    with pytest.raises(IndexingError, match=f"index {bad} is out of range for axis 1 with size 5"):
        ember.take(t, idx, axis=1)


def test_the_kernel_reads_and_writes_nothing_for_a_bad_index(wasm):
    from array import array

    from ember.wasm.runtime import R, W

    src = array("f", [1.0, 2.0, 3.0, 4.0])
    dst = array("f", [-1.0] * 4)
    idx = array("i", [0, 9])
    assert wasm.rt.call("take_x32", R(src, 4), R(idx, 2), W(dst, 4), 1, 2, 2, 2) == 2
    assert list(dst) == [-1.0] * 4
    assert wasm.rt.call("take_x32", R(src, 4), R(idx[:1], 1), W(dst, 2), 1, 2, 2, 1) == 0
    assert list(dst) == [1.0, 2.0, -1.0, -1.0]


def test_a_replayed_take_is_a_guarded_table_command(wasm):
    table = ember.arange(12, dtype="float32", device="wasm").reshape((6, 2))

    def f(pos):
        return ember.take(table, pos, axis=0) * 2.0

    g = ember.compile(f)
    for p in (0, 1, 2, 4):
        out = g(ember.tensor([p], dtype="int32", device="wasm"))
        assert out.tolist() == [[4.0 * p, 4.0 * p + 2.0]]
    fast = checks.fast_of(g)
    d = fast.describe()
    assert d["segments"] == 1 and not d["python_steps"] and d["table_steps"] == 2, d
    runs = fast.runs
    with pytest.raises(IndexingError, match="index 6 is out of range for axis 0 with size 6"):
        g(ember.tensor([6], dtype="int32", device="wasm"))
    assert fast.runs == runs + 1          # the table ran and stopped at the take
    # ...and replays as before afterwards
    assert g(ember.tensor([5], dtype="int32", device="wasm")).tolist() == [[20.0, 22.0]]
    assert fast.describe()["records"] == d["records"]


def test_a_llama_decode_step_is_one_call(wasm):
    res = checks.llama_decode(ember)
    assert res["same"], res
    assert res["segments"] == 1 and not res["python_steps"], res
