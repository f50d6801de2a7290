"""The wasm GEMM (kernels/gemm.c) bit for bit against its own summation order, modelled in numpy:
every output element starts from its bias (or 0) and adds A[i, k] * B[k, j] in k order, one
float32 multiply and one float32 add per k (no FMA), across gemm's blocks of K. The shapes reach
the packed products' paths: A packed per block of rows (more than 16 columns of B), A read in
place (16 columns or fewer), several row blocks (M over GEMM_MC = 96) and K blocks (K over
GEMM_KC = 384), partial MR row groups and NR column panels, batched products sharing one B or
each with its own. Runs on device "wasm" (wasmtime in CPython)."""
from __future__ import annotations

import pytest

import ember

np = pytest.importorskip("numpy")
pytest.importorskip("wasmtime")


def _sequential(a, b, bias=None):
    """(..., M, K) @ (..., K, N) in gemm's order: acc = bias or 0, then acc + a[:, k] * b[k, :]
    for k = 0, 1, ..., each step rounded to float32."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    acc = np.zeros(shape, np.float32)
    if bias is not None:
        acc = acc + np.asarray(bias, np.float32)
    for k in range(a.shape[-1]):
        acc = (acc + (a[..., :, k:k + 1] * b[..., k:k + 1, :]).astype(np.float32)).astype(np.float32)
    return acc


def _w(x):
    return ember.from_bytes(np.ascontiguousarray(x, np.float32).tobytes(), x.shape, "float32", device="wasm")


def _np(t):
    return np.frombuffer(bytes(t.to("python")._buf), np.float32).reshape(t.shape)


LINEAR = [  # M, K, N, bias
    (101, 400, 37, True),    # A packed: two row blocks, two K blocks, a 1-row group, a 5-column panel
    (97, 385, 24, False),    # one row past a block, one column past a K block
    (40, 20, 16, True),      # 16 columns: A read in place
    (17, 9, 17, True),       # just over SMALL_M rows and 2 * NR columns
]   # (16 rows or fewer take dot products of rows, summed four lanes at a time: another order)


@pytest.mark.parametrize("M, K, N, with_bias", LINEAR)
def test_linear_matches_its_summation_order(M, K, N, with_bias):
    rng = np.random.default_rng(M * 1000 + K + N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if with_bias else None
    got = ember.linear(_w(x), _w(w), None if b is None else _w(b))
    want = _sequential(x, w.T, b)
    assert got.shape == (M, N)
    assert np.array_equal(_np(got).view(np.uint32), want.view(np.uint32))


MATMUL = [  # a shape, b shape
    ((50, 390), (390, 24)),            # B packed from (K, N), A packed, two K blocks
    ((3, 20, 33), (33, 17)),           # one B for all batches: one product of 60 rows
    ((2, 3, 36, 19), (3, 19, 21)),     # a B per batch (broadcast), 6 products
    ((120, 7), (7, 9)),                # 9 columns: A read in place, a 1-column panel
]


@pytest.mark.parametrize("sa, sb", MATMUL)
def test_matmul_matches_its_summation_order(sa, sb):
    rng = np.random.default_rng(len(sa) * 100 + sa[-1])
    a = rng.standard_normal(sa).astype(np.float32)
    b = rng.standard_normal(sb).astype(np.float32)
    got = ember.matmul(_w(a), _w(b))
    want = _sequential(a, b)
    assert got.shape == want.shape
    assert np.array_equal(_np(got).view(np.uint32), want.view(np.uint32))


def test_nan_and_inf_propagate_through_packed_rows():
    # a NaN in one row of A and an inf in another reach only their own rows of the result
    rng = np.random.default_rng(7)
    x = rng.standard_normal((37, 30)).astype(np.float32)
    w = rng.standard_normal((20, 30)).astype(np.float32)
    x[5, 3] = np.nan
    x[9, 0] = np.inf
    got = _np(ember.linear(_w(x), _w(w)))
    want = _sequential(x, w.T)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[5]).all()
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


def test_python_mirrors_the_gemm_block_sizes():
    # ops_linalg sizes gemm's scratch (B's panels + A's packed block) from these numbers; the
    # kernel writes that far (kernels/linalg.h GEMM_APACK)
    import os
    import re

    from ember.wasm import ops_linalg as ol

    path = os.path.join(os.path.dirname(ol.__file__), "kernels", "linalg.h")
    if not os.path.exists(path):
        pytest.skip("the kernel sources are not installed")
    text = open(path).read()
    got = {n: int(re.search(rf"#define GEMM_{n} (\d+)", text).group(1)) for n in ("NR", "MR", "KC", "MC")}
    assert got == {"NR": ol.NR, "MR": ol.MR, "KC": ol.KC, "MC": ol.MC}
    assert ol._apack(101, 400) == 96 * 384 and ol._apack(17, 9) == 20 * 9
