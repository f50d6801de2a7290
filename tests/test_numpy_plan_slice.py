"""The numpy plan's slice steps (numpy_plan._slice_step: numpy_backend's slice with its index
tuple made once): the eager results for steps, negative steps and ends, several axes and empty
slices, each a contiguous copy that shares no memory with its input."""
import numpy as np
import pytest

import ember
from ember.plan import Plan

CASES = [lambda x: x[1:3, ::2], lambda x: x[::-1, 1:], lambda x: x[:, ::-2], lambda x: x[2:, -3:-1],
         lambda x: x[3:1], lambda x: x[:, 5:], lambda x: x[-1:, ::-1]]


@pytest.mark.parametrize("k", range(len(CASES)))
def test_compiled_slices_are_the_eager_ones(k):
    fn = CASES[k]
    x = ember.from_numpy(np.arange(4 * 6 * 2, dtype=np.float32).reshape(4, 6, 2)[:, :, 0].copy(), device="numpy")
    f = ember.compile(lambda x: fn(x) * 1.0 + 0.0)
    g = ember.compile(fn)
    want = fn(x).numpy()
    for _ in range(3):
        assert np.array_equal(f(x).numpy(), want)
        y = g(x)
        assert np.array_equal(y.numpy(), want)
    plans = [p for p in f.plans.values() if isinstance(p, Plan)]
    runs = [op.run.__qualname__ for op in plans[0].fast.ops if op.name == "slice"]
    assert runs and all(r.startswith("_slice_step") for r in runs)
    y = g(x)
    assert y._buf.flags.c_contiguous and not np.shares_memory(y._buf, x._buf)
