"""Reading webgpu tensors back (the native driver's readback buffers, kept by size class for
reuse, one copy into a bytearray the caller owns): values of many sizes and dtypes in any order,
buffers reused and bounded, numpy() arrays writable and independent of each other and of the
device buffer, reads left pending while others complete. Skipped where no adapter exists."""
from __future__ import annotations

import numpy as np
import pytest

import ember

from conftest import gpu, rand, webgpu_only

_REASON, pytestmark = webgpu_only()

if _REASON is None:
    from ember.webgpu import native
    from ember.webgpu.runtime import get_runtime


def _driver():
    d = get_runtime().driver
    if not hasattr(d, "_rb_free"):
        pytest.skip("the browser driver reads through JavaScript (its own test covers it)")
    return d


@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "float16", "bool", "uint8"])
def test_values_of_many_sizes(dtype):
    _driver()
    for n in (1, 3, 1023, 1024, 4097, 70000):
        a = (rand(n, seed=n) * 50).astype(dtype)
        t = gpu(a)
        y, want = (ember.logical_or(t, t), a | a) if dtype == "bool" else (t + t, a + a)
        np.testing.assert_array_equal(y.numpy(), want)
        assert t.tolist() == a.tolist()


def test_buffers_are_reused_and_bounded(monkeypatch):
    import wgpu

    d = _driver()
    monkeypatch.setattr(native, "READBACK_KEEP_MAX", 1 << 16)
    monkeypatch.setattr(d, "_rb_free", {})      # (none kept from earlier tests)
    made = []
    orig = d._dev.create_buffer

    def create_buffer(**kw):
        b = orig(**kw)
        if kw["usage"] & wgpu.BufferUsage.MAP_READ:
            made.append(kw["size"])
        return b

    monkeypatch.setattr(d._dev, "create_buffer", create_buffer)
    x = gpu(rand(2000, seed=1))                  # 8,000 bytes: the 8 KiB class
    for k in range(6):
        np.testing.assert_array_equal((x * float(k)).numpy(), rand(2000, seed=1) * np.float32(k))
    assert made.count(8192) <= 1, made
    big = gpu(rand(40000, seed=2))               # 160,000 bytes: past the kept classes
    for k in range(2):
        np.testing.assert_array_equal((big * float(k + 2)).numpy(), rand(40000, seed=2) * np.float32(k + 2))
    assert made.count(262144) == 2, made
    assert all(len(v) <= native.READBACK_KEEP for v in d._rb_free.values())
    assert 262144 not in d._rb_free or not d._rb_free[262144]


def test_numpy_arrays_are_writable_and_independent():
    _driver()
    t = gpu(np.arange(12, dtype=np.float32).reshape(3, 4))
    a, b = t.numpy(), t.numpy()
    a[0, 0] = 99.0
    assert a.flags.writeable and b[0, 0] == 0.0 and t.numpy()[0, 0] == 0.0
    c = (t + 1.0).numpy()
    c += 5.0
    assert t.numpy()[1, 1] == 5.0


def test_reads_pending_together():
    """Several read_later calls outstanding at once take different buffers of one class."""
    d = _driver()
    rt = get_runtime()
    xs = [gpu(np.full(300, k, np.float32)) for k in range(5)]
    laters = [rt.read_later(x._buf.storage, 1200, x._buf.offset * 4) for x in xs]
    for k, later in enumerate(reversed(laters)):
        got = np.frombuffer(later(), np.float32)
        assert (got == 4 - k).all()
    assert len(d._rb_free.get(native.READBACK_MIN, [])) <= native.READBACK_KEEP
