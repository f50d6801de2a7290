"""``Tensor.__getitem__`` against numpy: hypothesis-generated basic indices (ints, slices with
any step, None, ...) and one integer-array index, on every backend. The fixed cases (and the
error cases) are in ``op_cases`` (``getitem/*``)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ember
from ember.errors import IndexingError
from helpers import check_arrays, raises

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)


@st.composite
def basic_case(draw):
    shape = draw(shapes)
    key = draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    return shape, key


@SETTINGS
@given(basic_case())
def test_basic_indexing_matches_numpy(device, case):
    shape, key = case
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    check_arrays(lambda e, t: t[key], lambda np_, a: np.asarray(a[key]), [x], device, id=f"getitem{key!r}")


@st.composite
def array_case(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    axis = draw(st.integers(0, len(shape) - 1))
    n = shape[axis]
    idx = draw(st.lists(st.integers(-n, n - 1), min_size=0, max_size=5))
    before = tuple(draw(st.sampled_from([slice(None), slice(None, None, -1), 0])) if shape[i] else slice(None)
                   for i in range(axis))
    return shape, before + (idx,)


@SETTINGS
@given(array_case())
def test_integer_array_index_matches_numpy(device, case):
    shape, key = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    idx_pos = len(key) - 1

    def ember_key(e):
        k = list(key)
        k[idx_pos] = e.tensor(key[idx_pos], dtype="int64", device=device)  # as an int tensor too
        return tuple(k)

    check_arrays(lambda e, t: t[key], lambda np_, a: np.asarray(a[key]), [x], device, id=f"getitem{key!r}")
    check_arrays(lambda e, t: t[ember_key(e)], lambda np_, a: np.asarray(a[key]), [x], device, id=f"getitem-t{key!r}")


def test_index_array_on_another_device_is_moved(device):
    x = ember.arange(5, device=device)
    other = "numpy" if device != "numpy" else "python"
    assert x[ember.tensor([4, 0], device=other)].tolist() == [4, 0]


def test_numpy_index_arrays_and_scalars(device):
    x = ember.arange(10, device=device).reshape(5, 2)
    assert x[np.array([4, 0])].tolist() == [[8, 9], [0, 1]]
    assert x[np.int64(2), np.int32(1)].item() == 5
    assert x[ember.tensor(3)].tolist() == [6, 7]


def test_out_of_range_names_index_axis_and_size(device):
    x = ember.zeros((2, 3), device=device)
    with raises(IndexingError, "index 3", "axis 1", "size 3", "(2, 3)"):
        x[1, 3]
    with raises(IndexingError, "index -3", "axis 0", "size 2"):
        x[-3]
    with raises(IndexingError, "take", "7"):
        x[:, [0, 7]]


def test_iteration_stops_at_the_end(device):
    x = ember.arange(6, device=device).reshape(3, 2)
    assert [row.tolist() for row in x] == [[0, 1], [2, 3], [4, 5]]
    a, b, c = x
    assert c.tolist() == [4, 5]


@pytest.mark.parametrize("key", [slice(None, 2.5), "a", 1.0, [True, False]])
def test_unsupported_keys(key):
    with pytest.raises(IndexingError):
        ember.zeros((2,))[key]
