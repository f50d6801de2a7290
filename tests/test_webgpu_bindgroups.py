"""Bind groups are cached per (pipeline, buffers, offsets) and dropped when a buffer is freed:
a replayed plan creates none, and a destroyed buffer is never bound again."""
import gc

import pytest

import ember
from ember.errors import DeviceError


@pytest.fixture
def rt():
    try:
        ember.get_backend("webgpu")
    except DeviceError as e:
        pytest.skip(f"webgpu backend unavailable on this machine: {e}")
    from ember.webgpu.runtime import get_runtime

    return get_runtime()


def test_replay_reuses_bind_groups_and_free_forgets_them(rt):
    drv = rt.driver
    f = ember.compile(lambda x, w: ember.relu(x @ w) * 2.0 + 1.0)
    x = ember.ones((4, 8), device="webgpu")
    w = ember.ones((8, 3), device="webgpu")
    want = f(x, w).tolist()
    assert f(x, w).tolist() == want
    gc.collect()   # lazy results sit in reference cycles: their buffers return to the pool at gc
    n = len(drv._bg_cache)
    for _ in range(3):
        assert f(x, w).tolist() == want == [[17.0] * 3] * 4
        gc.collect()
    assert len(drv._bg_cache) == n, "a replay created new bind groups"
    # Freeing a buffer drops every cached group that binds it.
    (key, (bg, pipe, bufs)) = next(iter(drv._bg_cache.items()))
    victim = bufs[0]
    users = set(drv._bg_by_buf[id(victim)])
    assert key in users
    drv._forget(victim)
    assert not users & set(drv._bg_cache)
    assert id(victim) not in drv._bg_by_buf
    assert f(x, w).tolist() == want
