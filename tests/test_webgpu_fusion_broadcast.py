"""A small lazy operand broadcast into a larger elementwise expression is read as its own
expression (no dispatch of its own); a long one, or one that runs a matmul, is still realised
first. Values against float64 numpy, dispatches counted."""
from __future__ import annotations

import numpy as np
import pytest

import ember

from conftest import rand


def _count(rt, fn):
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    out = fn()
    return out, rt.stats["dispatches"] - d0


def test_small_lazy_operand_is_read_broadcast(rt):
    a, b = rand(6, 1), rand(6, 40, seed=1)
    ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")
    got, n = _count(rt, lambda: (tb * ember.rsqrt(ta * ta + 1.0)).numpy())
    a64 = a.astype(np.float64)
    np.testing.assert_allclose(got, b * (1 / np.sqrt(a64 * a64 + 1)), rtol=1e-5, atol=1e-6)
    assert n == 1


def test_two_lazy_operands_broadcast_over_different_axes(rt):
    a, b, c = rand(1, 5, 1), rand(3, 1, 4, seed=1), rand(3, 5, 4, seed=2)
    ta, tb, tc = (ember.tensor(v, device="webgpu") for v in (a, b, c))
    got, n = _count(rt, lambda: (tc + ember.exp(ta) * (tb - 2.0)).numpy())
    np.testing.assert_allclose(got, c + np.exp(a.astype(np.float64)) * (b - 2.0), rtol=1e-5, atol=1e-6)
    assert n == 1


def test_long_lazy_operand_is_realised_first(rt):
    a, b = rand(6, 1), rand(6, 40, seed=1)
    ta, tb = ember.tensor(a, device="webgpu"), ember.tensor(b, device="webgpu")

    def run():
        s = ta
        for k in range(6):
            s = s * 1.5 + float(k)
        return (tb + s).numpy()
    got, n = _count(rt, run)
    s = a.astype(np.float64)
    for k in range(6):
        s = s * 1.5 + k
    np.testing.assert_allclose(got, b + s, rtol=1e-5, atol=1e-5)
    assert n == 2


def test_lazy_matmul_operand_is_realised_first(rt):
    a, w, b = rand(6, 7), rand(7, 1, seed=1), rand(6, 40, seed=2)
    ta, tw, tb = (ember.tensor(v, device="webgpu") for v in (a, w, b))
    got = (tb * ember.exp(ta @ tw)).numpy()
    np.testing.assert_allclose(got, b * np.exp(a.astype(np.float64) @ w), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["bias", "bias_view", "row_2d", "bias_and_residual", "column_too"])
def test_row_vector_operands(rt, form):
    """A vector along the last axis (a bias) is read at ``i % n`` (one remainder, not the
    output's whole multi-index), in fused elementwise kernels and in matmul epilogues, from
    a view at an offset too; with a column operand too the full multi-index is used."""
    x, w, r = rand(2, 24, 16), rand(16, 20, seed=1), rand(2, 24, 20, seed=2)
    big = rand(40, seed=3)
    b = big[5:25] if form == "bias_view" else (big[:20].reshape(1, 20) if form == "row_2d" else big[:20])
    col = rand(2, 24, 1, seed=4)
    tx, tw, tr, tcol = (ember.tensor(v, device="webgpu") for v in (x, w, r, col))
    tb = ember.tensor(big, device="webgpu")[5:25] if form == "bias_view" else ember.tensor(b, device="webgpu")
    x64, w64, b64 = x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)
    want = x64 @ w64 + b64
    got = ember.matmul(tx, tw) + tb
    if form == "bias_and_residual":
        got, want = got + tr, want + r
    if form == "column_too":
        got, want = got * tcol, want * col
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    # the same operands in a plain fused elementwise kernel (no matmul)
    np.testing.assert_allclose((tr * 2.0 + tb).tanh().numpy(), np.tanh(r * 2.0 + b64), rtol=1e-5, atol=1e-6)
