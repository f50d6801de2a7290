"""WebGPU limits (issue 12): tensors over ``maxStorageBufferBindingSize`` run in chunks where the
kernel allows it (fused elementwise chains, casts, where; matmul by row blocks) and fail with a
DeviceLimitError naming op, shape, bytes and limit elsewhere, before any work is submitted; a lost
device and out-of-memory surface as typed errors. The limits are lowered on lavapipe with
``ember.webgpu.set_limits`` (or ``EMBER_WEBGPU_MAX_BINDING_BYTES``), so the chunked paths run
on small tensors."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ember
from ember.errors import DeviceError, DeviceLimitError, DeviceLostError

LIMIT = 4096   # bytes: 1024 float32 per binding


@pytest.fixture
def low(rt):
    """The runtime (conftest's ``rt``: skips where no adapter exists) with its binding limit
    lowered to LIMIT for the test."""
    import ember.webgpu as W

    W.set_limits(LIMIT)
    W.reset_stats()
    try:
        yield rt
    finally:
        W.set_limits(None, None)


def G(a):
    return ember.tensor(np.ascontiguousarray(a), device="webgpu")


def test_set_limits_lowers_the_effective_limits(low):
    assert low.max_binding == LIMIT
    assert ember.webgpu.info()["limits"]["max_storage_buffer_binding_size"] == LIMIT
    assert low.driver.limits["max_storage_buffer_binding_size"] > LIMIT   # the adapter's own


def test_chunked_elementwise_matches_numpy(low):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((37, 101)).astype(np.float32)      # 14,948 bytes: 4 bindings' worth
    y = rng.standard_normal((101,)).astype(np.float32)
    z = rng.standard_normal((37, 1)).astype(np.float32)
    X, Y, Z = G(x), G(y), G(z)
    before = ember.webgpu.stats()["fused_kernels"]
    got = ((X * 2 + Y) * Z).tanh()
    np.testing.assert_allclose(got.numpy(), np.tanh((x * 2 + y) * z), rtol=1e-5, atol=1e-6)
    assert ember.webgpu.stats()["fused_kernels"] - before >= 4, "the chain did not run in chunks"
    # a row vector alone broadcast (read at the chunk's global index % 101, not its local one)
    before = ember.webgpu.stats()["fused_kernels"]
    np.testing.assert_allclose((X * 2 + Y).tanh().numpy(), np.tanh(x * 2 + y), rtol=1e-5, atol=1e-6)
    assert ember.webgpu.stats()["fused_kernels"] - before >= 4, "the row-vector chain did not run in chunks"
    # a strided view (every other row) and an offset slice of a large buffer, a where and a cast
    np.testing.assert_allclose((X[::2] - 1).numpy(), x[::2] - 1, rtol=1e-6)
    np.testing.assert_allclose((X[5:, 3:] * 3).numpy(), x[5:, 3:] * 3, rtol=1e-6)
    np.testing.assert_array_equal(ember.where(X > 0, X, Y).numpy(), np.where(x > 0, x, y))
    np.testing.assert_array_equal((X * 100).astype(ember.int32).numpy(), (x * 100).astype(np.int32))
    # writing into regions of a larger buffer (concat)
    np.testing.assert_allclose(ember.concat([X, X * 2], axis=0).numpy(), np.concatenate([x, x * 2], axis=0))
    np.testing.assert_allclose(ember.concat([X, Z], axis=1).numpy(), np.concatenate([x, z], axis=1))
    n = 3000                                                   # 1-D, not a multiple of a chunk
    v = rng.standard_normal(n).astype(np.float32)
    np.testing.assert_allclose((G(v).exp() + 1).numpy(), np.exp(v) + 1, rtol=1e-5)


def test_chunked_matmul_matches_numpy(low):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((200, 64)).astype(np.float32)      # A: 51 KB, C: 9.6 KB
    b = rng.standard_normal((64, 12)).astype(np.float32)       # B fits one binding
    A, B = G(a), G(b)
    before = ember.webgpu.stats()["dispatches"]
    np.testing.assert_allclose((A @ B).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert ember.webgpu.stats()["dispatches"] - before > 10, "the matmul did not run by row blocks"
    # an epilogue on a chunked matmul runs as chunked elementwise work afterwards
    np.testing.assert_allclose(ember.relu(A @ B + 1).numpy(), np.maximum(a @ b + 1, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((A[3:150] @ B).numpy(), a[3:150] @ b, rtol=1e-4, atol=1e-4)
    bt = G(np.ascontiguousarray(b.T))                           # x @ w.T, the Linear layer's form
    np.testing.assert_allclose((A @ bt.T).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    # a right operand over one binding (a Linear layer's 300 x 64 weight, 77 KB): by blocks of
    # its columns too, each copied into its columns of the output
    wgt = rng.standard_normal((300, 64)).astype(np.float32)
    np.testing.assert_allclose((A @ G(wgt).T).numpy(), a @ wgt.T, rtol=1e-4, atol=1e-4)
    # batched: one batch at a time, by row blocks (a broadcast right operand, and batch x batch)
    a3 = rng.standard_normal((3, 48, 64)).astype(np.float32)
    np.testing.assert_allclose((G(a3) @ B).numpy(), a3 @ b, rtol=1e-4, atol=1e-4)
    a4 = rng.standard_normal((2, 3, 40, 16)).astype(np.float32)
    b4 = rng.standard_normal((2, 1, 16, 8)).astype(np.float32)
    np.testing.assert_allclose((G(a4) @ G(b4)).numpy(), a4 @ b4, rtol=1e-4, atol=1e-4)


def test_unchunkable_kernel_fails_clearly_before_submitting(low):
    x = np.arange(37 * 101, dtype=np.float32).reshape(37, 101)
    X = G(x)
    ember.webgpu.synchronize()
    before = ember.webgpu.stats()["dispatches"]
    with pytest.raises(DeviceLimitError) as ei:
        X.sum(axis=0)
    e = ei.value
    msg = str(e)
    assert e.op == "sum" and e.shape == (101,) and e.limit == LIMIT and e.nbytes > LIMIT
    assert "sum" in msg and "(101,)" in msg and str(LIMIT) in msg and "maxStorageBufferBindingSize" in msg
    assert ember.webgpu.stats()["dispatches"] == before, "work of the refused op was recorded"
    # a transposed read of a large tensor spans more than a binding per chunk: refused too
    with pytest.raises(DeviceLimitError, match="maxStorageBufferBindingSize"):
        (X.T * 2).numpy()
    with pytest.raises(DeviceLimitError, match="pad"):          # pad has its own kernel
        ember.pad(X, ((1, 2), (3, 0))).numpy()
    # a right operand whose every column spans more than a binding (k-major 64 x 64)
    with pytest.raises(DeviceLimitError, match="matmul"):
        (G(np.ones((64, 64), np.float32)) @ G(np.ones((64, 64), np.float32))).numpy()
    # below the limit everything still works as before
    np.testing.assert_allclose(G(x[:5, :100]).sum(axis=0).numpy(), x[:5, :100].sum(axis=0))


def test_buffer_over_max_buffer_size_is_a_limit_error(low):
    ember.webgpu.set_limits(LIMIT, 8192)
    with pytest.raises(DeviceLimitError, match="maxBufferSize") as ei:
        G(np.ones(4096, np.float32))                             # 16 KB
    assert ei.value.nbytes == 16384 and ei.value.limit == 8192


@pytest.mark.usefixtures("rt")   # skips where no adapter exists here
def test_env_var_limit_and_device_loss_in_a_fresh_process():
    """A separate process: EMBER_WEBGPU_MAX_BINDING_BYTES sets the limit at start-up, and after
    GPUDevice.destroy() every use raises DeviceLostError, never a raw wgpu exception, until
    ``ember.webgpu.init()`` opens a new device."""
    code = textwrap.dedent("""
        import numpy as np, ember
        from ember.errors import DeviceLostError, DeviceError
        from ember.webgpu.runtime import get_runtime
        rt = get_runtime()
        assert rt.max_binding == 8192, rt.max_binding
        x = np.arange(5000, dtype=np.float32)
        X = ember.tensor(x, device="webgpu")
        assert np.array_equal((X * 2).numpy(), x * 2)
        rt.driver.lose("destroyed by the test")
        for f in (lambda: (X * 3).numpy(), lambda: ember.ones((4,), device="webgpu").tolist(),
                  lambda: ember.tensor([1.0], device="webgpu")):
            try:
                f()
            except DeviceLostError as e:
                assert "lost" in str(e) and "device='python'" in str(e), e
            else:
                raise AssertionError("no DeviceLostError")
        import asyncio
        import ember.webgpu
        asyncio.run(ember.webgpu.init())      # a new device: webgpu works again
        assert (ember.tensor([1.0, 2.0], device="webgpu") * 3).tolist() == [3.0, 6.0]
        print("OK")
    """)
    env = dict(os.environ, EMBER_WEBGPU_MAX_BINDING_BYTES="8192")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr
    assert issubclass(DeviceLostError, DeviceError)


def test_wgpu_errors_are_typed():
    from ember.errors import DeviceOutOfMemoryError
    from ember.webgpu.driver import device_error

    class GPUOutOfMemoryError(Exception):
        pass

    class D:
        lost = None

    d = D()
    assert isinstance(device_error(GPUOutOfMemoryError("boom"), "allocating", d), DeviceOutOfMemoryError)
    e = device_error(RuntimeError("Validation Error\n\nCaused by:\n  In wgpuQueueWriteBuffer\n    Parent device is lost"),
                     "writing", d)
    assert isinstance(e, DeviceLostError) and d.lost == "Parent device is lost"
    assert isinstance(device_error(RuntimeError("anything"), "x", d), DeviceLostError)   # lost stays lost
    assert type(device_error(RuntimeError("bad"), "x", D())) is DeviceError


def test_chunks_follow_a_larger_offset_alignment(low, monkeypatch):
    """Chromium and most GPUs align storage bindings to 256 bytes (lavapipe: 32): a larger
    alignment, a multiple of the device's, is still valid, so it can be emulated here."""
    monkeypatch.setitem(low.limits, "min_storage_buffer_offset_alignment", 256)
    ember.webgpu.set_limits(8192)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 101)).astype(np.float32)
    r = rng.standard_normal((101,)).astype(np.float32)
    np.testing.assert_allclose(((G(x) * 2 + G(r)).tanh()).numpy(), np.tanh(x * 2 + r), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((G(x)[1:, 7:] + 1).numpy(), x[1:, 7:] + 1, rtol=1e-6)
    a = rng.standard_normal((200, 64)).astype(np.float32)
    b = rng.standard_normal((64, 12)).astype(np.float32)
    np.testing.assert_allclose((G(a)[3:] @ G(b)).numpy(), a[3:] @ b, rtol=1e-4, atol=1e-4)
    wgt = rng.standard_normal((300, 64)).astype(np.float32)            # by column blocks too
    np.testing.assert_allclose((G(a) @ G(wgt).T).numpy(), a @ wgt.T, rtol=1e-4, atol=1e-4)
    a3 = rng.standard_normal((3, 48, 64)).astype(np.float32)          # 48 x 12 outputs: 2,304 bytes each
    np.testing.assert_allclose((G(a3) @ G(b)).numpy(), a3 @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ember.concat([G(x), G(x)], axis=1).numpy(), np.concatenate([x, x], axis=1))
