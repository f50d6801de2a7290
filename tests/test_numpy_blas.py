"""core/backends/numpy_blas.py: mid-sized products on one OpenBLAS thread, the count restored; large
ones in blocks over parallel_for's threads, the same bits as one product."""
import threading

import numpy as np
import pytest

from core.backends import numpy_blas as B


@pytest.fixture
def blas_at_two(monkeypatch):
    """OpenBLAS set to 2 threads (restored after); yields (get, seen) where ``seen`` collects
    (multiply-adds, OpenBLAS's thread count) of every np.matmul the code under test makes."""
    fns = B.api()
    if not fns:
        pytest.skip("no OpenBLAS thread control in this numpy")
    get, put = fns
    B.split_same_bits()             # (its one-time probe, before the spy counts products)
    n0 = get()
    put(2)
    seen = []
    real = np.matmul

    def spy(a, b, out=None):
        seen.append((B.macs(a.shape, b.shape), get()))
        return real(a, b, out=out)
    monkeypatch.setattr(B.np, "matmul", spy)
    try:
        yield get, seen
    finally:
        put(n0)


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


def test_mid_sized_products_run_on_one_thread_and_restore(blas_at_two):
    get, seen = blas_at_two
    a = np.ones((256, 128), np.float32)
    B.matmul(a[:64], np.ones((128, 512), np.float32))     # 2**22 multiply-adds: one thread, whole
    B.matmul(a, np.ones((128, 512), np.float32))          # 2**24: blocks of rows, each on one thread
    B.matmul(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))   # tiny: OpenBLAS's own choice
    assert seen[0] == (1 << 22, 1) and seen[-1] == (512, 2)
    blocks = seen[1:-1]
    if B.split_same_bits():
        assert len(blocks) >= 2 and {n for _, n in blocks} == {1} and sum(m for m, _ in blocks) == 1 << 24
    else:                                                  # this BLAS: not split (one thread, whole)
        assert blocks == [(1 << 24, 1)], blocks
    assert get() == 2                                      # restored
    with pytest.raises(ValueError):                        # restored after an error too
        B.matmul(a, np.ones((64, 512), np.float32))        # (mismatched inner sizes)
    assert get() == 2


@pytest.mark.parametrize("sa, sb, how", [
    ((256, 128), (128, 512), "rows"),
    ((8, 32, 128), (128, 384), "stack"),                  # a transformer's linear: rows of a stack
    ((301, 333), (333, 97), "rows"),                      # blocks of 75 and 76 rows
    ((512, 1000), (1000, 200), "out"),
    ((256, 256), (256, 256), "a_view"),                   # a transposed (not contiguous) view of A
])
def test_split_products_are_the_same_bits_as_one(blas_at_two, sa, sb, how):
    """Each block is the same BLAS kernel over the same summed axis as the whole product: the
    result equals one product on one OpenBLAS thread bit for bit. Where this BLAS does not give a
    block of rows the whole product's bits (``split_same_bits``: seen on an AMD EPYC), products
    are not split at all."""
    get, seen = blas_at_two
    rng = np.random.default_rng(7)
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    if how == "a_view":
        a = a.T
    _, put = B.api()
    put(1)
    want = np.matmul(a, b)
    put(2)
    seen.clear()
    if how == "out":
        out = np.full(want.shape, np.nan, np.float32)
        assert B.matmul(a, b, out=out) is out
        got = out
    else:
        got = B.matmul(a, b)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert get() == 2
    if not B.split_same_bits():
        assert len(seen) == 1, seen                                     # not split
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        return
    np.testing.assert_array_equal(got, want)
    assert len(seen) >= 2 and {n for _, n in seen} == {1}, seen      # it did split


def test_few_rows_are_not_split(blas_at_two):
    """Blocks of columns, or of fewer than 64 rows, are not the whole product's bits in OpenBLAS:
    a product of 40 rows runs whole (on one thread)."""
    get, seen = blas_at_two
    a = np.ones((40, 120), np.float32)
    B.matmul(a, np.ones((120, 6625), np.float32))
    assert seen == [(40 * 120 * 6625, 1)]


def test_parallel_for_runs_each_item_once_on_two_threads(blas_at_two):
    """Item 0 waits for item 1 to have started: only a second thread can start it, so this
    passes only when a helper thread takes items while the caller is busy."""
    started = threading.Event()
    ran, names = [], set()

    def item(i):
        names.add(threading.current_thread().name)
        if i == 1:
            started.set()
        elif i == 0:
            assert started.wait(20), "no second thread took an item"
        ran.append(i)
    for _ in range(3):
        ran.clear()
        started.clear()
        B.parallel_for(6, lambda i: item(i if i < 2 else 2 + i))
        assert sorted(ran) == [0, 1, 4, 5, 6, 7]
    assert len(names) == 2


def test_parallel_for_errors_nesting_and_one_thread(blas_at_two, monkeypatch):
    get, _ = blas_at_two

    def bad(i):
        if i == 3:
            raise KeyError("item 3")
    with pytest.raises(KeyError, match="item 3"):
        B.parallel_for(8, bad)
    assert get() == 2
    # a loop inside an item runs on the thread that runs the item (no helper waits on itself)
    got = []
    B.parallel_for(4, lambda i: B.parallel_for(3, lambda j: got.append((i, j))))
    assert sorted(got) == [(i, j) for i in range(4) for j in range(3)]
    # EMBER_NUMPY_THREADS=1 (read at import): everything on the calling thread, in order
    monkeypatch.setattr(B, "_CAP", 1)
    me, seen = threading.current_thread().name, []
    B.parallel_for(5, lambda i: seen.append((i, threading.current_thread().name)))
    assert seen == [(i, me) for i in range(5)]


def test_off_switch(monkeypatch):
    monkeypatch.setenv("EMBER_NUMPY_BLAS_SPLIT", "on")
    assert B._find() is False


def test_training_llm_and_quant_kernels_use_the_thread_rule(blas_at_two):
    """Backward convolutions and linears, attention_cached's prefill and qlinear: every mid-sized
    product runs on one thread (a direct np.matmul would see OpenBLAS's two), results as numpy's."""
    import ember
    import ember.native
    from ember import quant
    from tests.test_quant import make_weight

    get, seen = blas_at_two
    rng = np.random.default_rng(1)

    def t(a, grad=False):
        x = ember.from_numpy(np.asarray(a, np.float32), device="numpy")
        return x.requires_grad_() if grad else x

    # linear: grad of the weight is g^T x, (128 x 256) @ (256 x 512)
    x0, w0 = rng.standard_normal((256, 512)), rng.standard_normal((128, 512))
    x, w = t(x0, True), t(w0, True)
    g0 = rng.standard_normal((256, 128))
    (ember.linear(x, w) * t(g0)).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), g0.T @ x0, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.grad.numpy(), g0 @ w0, rtol=1e-4, atol=1e-3)
    # conv2d backward, 32 -> 32 channels 3x3 on 24x24, stride 1 and 2
    for stride in (1, 2):
        xc0, wc0 = rng.standard_normal((2, 32, 24, 24)), rng.standard_normal((32, 32, 3, 3))
        xc, wc = t(xc0, True), t(wc0, True)
        ember.conv2d(xc, wc, stride=stride, padding=1).sum().backward()
        assert np.isfinite(wc.grad.numpy()).all() and np.isfinite(xc.grad.numpy()).all()
    # attention_cached prefill: 64 tokens x 8 query heads over 2 key/value heads, d = 64
    T, hq, hkv, d = 64, 8, 2, 64
    q, k, v = (rng.standard_normal((T, h, d)).astype(np.float32) for h in (hq, hkv, hkv))
    kc, vc = t(np.zeros((T, hkv, d))), t(np.zeros((T, hkv, d)))
    y = ember.attention_cached(t(q), t(k), t(v), kc, vc, ember.from_numpy(np.array([0], np.int32), device="numpy"))
    qg = q.reshape(T, hkv, hq // hkv, d).astype(np.float64)
    s = np.einsum("tgjd,sgd->tgjs", qg, k.astype(np.float64)) / np.sqrt(d)
    s[np.triu(np.ones((T, T), bool), 1)[:, None, None, :].repeat(hkv, 1).repeat(hq // hkv, 2)] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("tgjs,sgd->tgjd", p, v.astype(np.float64)).reshape(T, hq, d)
    np.testing.assert_allclose(y.numpy(), want, rtol=2e-5, atol=2e-5)
    # qlinear, the fast (q8_0) path with 64 rows of x and the generic (q4_k) path
    # (the numpy paths: ember.native's qlinear, where loaded, takes these rows first)
    for qtype, kk in (("q8_0", 512), ("q4_k", 512)):
        wq, ref = make_weight(qtype, 256, kk, "numpy", seed=3)
        xq = rng.standard_normal((64, kk)).astype(np.float32)
        with ember.native.disabled():
            got = quant.linear(t(xq), wq).numpy()
        want = xq.astype(np.float64) @ ref.astype(np.float64).T
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    mid = [n for m, n in seen if B._OWN_SINGLE < m < B.PARALLEL_MACS]
    assert len(mid) >= 8 and set(mid) == {1}, seen
    assert get() == 2


def test_split_same_bits_is_what_this_blas_does():
    """The probe's answer is a fact about this BLAS: a block of rows of a product, on one thread,
    against the same rows of the whole product."""
    fns = B.api()
    if not fns:
        pytest.skip("no OpenBLAS thread control in this numpy")
    get, put = fns
    n0 = get()
    put(1)
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((256, 128)).astype(np.float32)
        b = rng.standard_normal((128, 512)).astype(np.float32)
        whole = np.matmul(a, b)
        blocks = np.concatenate([np.matmul(a[i:i + 64], b) for i in range(0, 256, 64)])
    finally:
        put(n0)
    if not np.array_equal(blocks, whole):
        assert B.split_same_bits() is False
    assert B.split_same_bits() in (True, False)
