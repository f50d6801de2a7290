"""core/backends/numpy_blas.py: mid-sized products on one OpenBLAS thread, the count restored."""
import numpy as np
import pytest

from core.backends import numpy_blas as B


def test_matmul_matches_numpy():
    rng = np.random.default_rng(0)
    for sa, sb in [((3, 4), (4, 5)), ((64, 96), (96, 80)), ((2, 70, 64), (64, 90)), ((5,), (5, 3)), ((4, 5), (5,))]:
        a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
        np.testing.assert_array_equal(B.matmul(a, b), np.matmul(a, b))
    out = np.empty((64, 80), np.float32)
    a, b = rng.standard_normal((64, 96)).astype(np.float32), rng.standard_normal((96, 80)).astype(np.float32)
    assert B.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, a @ b)


def test_macs():
    assert B.macs((8, 32, 128), (128, 512)) == 32 * 128 * 512
    assert B.macs((128,), (128, 4)) == 128 * 4
    assert B.macs((3, 128), (128,)) == 3 * 128


def test_mid_sized_products_run_on_one_thread_and_restore(monkeypatch):
    fns = B.api()
    if not fns:
        pytest.skip("no OpenBLAS thread control in this numpy")
    get, put = fns
    n0 = get()
    put(2)
    try:
        seen = []
        real = np.matmul

        def spy(a, b, out=None):
            seen.append(get())
            return real(a, b, out=out)
        monkeypatch.setattr(B.np, "matmul", spy)
        a = np.ones((256, 128), np.float32)
        B.matmul(a, np.ones((128, 512), np.float32))          # 2**24 multiply-adds: one thread
        B.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))   # tiny: OpenBLAS's own choice
        assert seen == [1, 2]
        assert get() == 2                                      # restored
        with pytest.raises(ValueError):                        # restored after an error too
            B.matmul(a, np.ones((64, 512), np.float32))        # (mismatched inner sizes)
        assert get() == 2
    finally:
        put(n0)


def test_off_switch(monkeypatch):
    monkeypatch.setenv("EMBER_NUMPY_BLAS_SPLIT", "on")
    assert B._find() is False
