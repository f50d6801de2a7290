"""Bind groups are cached per (pipeline, buffers, offsets) and dropped when a buffer is freed:
a replayed plan creates none, and a destroyed buffer is never bound again."""
import gc

import pytest

import ember
from ember.errors import DeviceError


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


def test_repeated_training_steps_reach_a_steady_state_of_bind_groups(rt):
    """The pool hands out the earliest-made free buffer, so a repeated step binds the same
    buffers each time: after a few steps a training step creates no bind groups (with a
    last-freed-first pool, about half of its dispatches built a new group on every step)."""
    from ember import nn
    import ember.nn.functional as F

    ember.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4), nn.LayerNorm(4)).to("webgpu")
    opt = ember.optim.Adam(model.parameters(), lr=1e-2)
    x = ember.randn((5, 8), device="webgpu")
    y = ember.randn((5, 4), device="webgpu")
    drv = rt.driver
    made = []
    for _ in range(14):
        n = len(drv._bg_cache)
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        made.append(len(drv._bg_cache) - n)
    assert made[-3:] == [0, 0, 0], f"bind groups made per step: {made}"


def test_the_pool_reuses_the_earliest_made_free_buffer(rt):
    pool = rt.pool
    a, b, c = (pool.acquire(1000) for _ in range(3))
    bufs = [a.buf, b.buf, c.buf]
    serial = [pool.serial[id(x)] for x in bufs]
    del b, c, a          # freed in an order unrelated to their age
    again = pool.acquire(1000)
    # the earliest-made free buffer of that size class: ours, or an older one left by earlier tests
    assert pool.serial[id(again.buf)] <= min(serial)
    older = [e for e in pool.free_lists.get(again.nbytes, []) if e[0] < pool.serial[id(again.buf)]]
    assert not older


def test_an_invalid_dispatch_still_raises_a_device_error(rt):
    """Dispatches are recorded through wgpu-native directly (natively); the pass's validation
    error still surfaces, typed, when the batch is submitted, and the device keeps working."""
    ember.ones((4,), device="webgpu").tolist()
    drv = rt.driver
    pipe = next(iter(rt.pipelines.values()))
    st = rt.alloc(64)
    too_many = drv.limits["max_compute_workgroups_per_dimension"] + 1
    with pytest.raises(DeviceError):
        drv.dispatch(pipe, [(st.buf, 0, 64)], bytes(16), (too_many, 1, 1))
        drv.flush()
    assert (ember.ones((3,), device="webgpu") * 2).tolist() == [2.0, 2.0, 2.0]
