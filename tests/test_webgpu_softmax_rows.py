"""webgpu's softmax_rows.wgsl (softmax / log_softmax along the last axis, each row read once into
registers, several short rows to a workgroup) against a float64 numpy reference, next to the
line kernel (softmax.wgsl: other axes, longer rows, ``EMBER_WEBGPU_SOFTMAX_ROWS=0``): widths on
every path of ``ln_rows_shape`` (vec4 and scalar units, 1 to 256 lanes, rows past its limit),
views that start mid-buffer, -inf / +inf / NaN entries and rows of only -inf, huge values,
reductions with and without subgroup shuffles; and the GPU route of a large attention (scores,
one softmax_rows dispatch with fully masked rows as zeros, the value product) against the
reference with bool, float and causal masks. Skipped where no adapter exists."""
from __future__ import annotations

import numpy as np
import pytest

import ember

from conftest import gpu, rand, webgpu_only
from op_cases_nn import _np_sdpa

_REASON, pytestmark = webgpu_only()

if _REASON is None:
    from ember.webgpu import nn

WIDTHS = [1, 3, 4, 32, 128, 384, 385, 1000, 1024, 4096, 5001]


@pytest.fixture(params=["rows", "line"])
def path(request, monkeypatch):
    """Each test with softmax_rows.wgsl (every width up to 256 lanes, not only the default's 32)
    and with the line kernel alone (nn.SOFTMAX_ROWS: what EMBER_WEBGPU_SOFTMAX_ROWS sets)."""
    monkeypatch.setattr(nn, "SOFTMAX_ROWS", request.param == "rows")
    monkeypatch.setattr(nn, "LN_ROWS_LANES", 256)
    return request.param


def ref(x, log=False, axis=-1):
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        z = x - x.max(axis=axis, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=axis, keepdims=True)
        return z - np.log(s) if log else e / s


def _rows_taken(D):
    shape = nn.ln_rows_shape(D)
    return nn.SOFTMAX_ROWS and shape is not None and shape[1] <= nn.LN_ROWS_LANES


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("D", WIDTHS)
def test_matches_float64(path, kernels, D, log):
    x = rand(3, 5, D, seed=D) * 4
    fn = ember.log_softmax if log else ember.softmax
    got = fn(gpu(x), axis=-1).numpy()
    np.testing.assert_allclose(got, ref(x, log), rtol=2e-6, atol=2e-6)
    assert ("softmax_rows" in kernels) == _rows_taken(D), kernels


@pytest.mark.parametrize("D", [5, 128, 385])
@pytest.mark.parametrize("start", [1, 2, 4])
def test_view_starting_mid_buffer(path, D, start):
    """A contiguous view at an offset (4-aligned: vec4 loads; not: four scalar loads a unit)."""
    flat = rand(start + 6 * D, seed=start)
    x = gpu(flat)[start:].reshape(6, D)
    np.testing.assert_allclose(ember.softmax(x).numpy(), ref(flat[start:].reshape(6, D)), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("D", [7, 128, 1000])
def test_infinities_nan_and_huge_values(path, D):
    """-inf entries are zeros; a row of only -inf, a row holding +inf or NaN give NaN (as numpy
    and PyTorch); 1e30 and -1e30 do not overflow."""
    x = rand(6, D, seed=1) * 3
    x[0, ::3] = -np.inf
    x[1, :] = -np.inf
    x[2, D // 2] = np.inf
    x[3, D - 1] = np.nan
    x[4, :2] = (1e30, -1e30)
    x[5, 0] = 1e4
    for log in (False, True):
        fn = ember.log_softmax if log else ember.softmax
        got = fn(gpu(x)).numpy()
        want = ref(x, log)
        np.testing.assert_allclose(got[[0, 4, 5]], want[[0, 4, 5]], rtol=2e-6, atol=2e-6)
        assert np.isnan(got[1:4]).all()


@pytest.mark.parametrize("D", [32, 385, 1000, 4096])
def test_without_subgroup_shuffles(monkeypatch, D):
    """EMBER_WEBGPU_SUBGROUPS=0: a row's max and sum meet by workgroup-memory trees alone."""
    monkeypatch.setattr(nn, "SOFTMAX_ROWS", True)
    monkeypatch.setattr(nn, "LN_ROWS_LANES", 256)
    monkeypatch.setenv("EMBER_WEBGPU_SUBGROUPS", "0")
    x = rand(7, D, seed=D) * 5
    np.testing.assert_allclose(ember.softmax(gpu(x)).numpy(), ref(x), rtol=2e-6, atol=2e-6)


def test_other_axes_take_the_line_kernel(kernels):
    """softmax_rows reads rows of the last axis; another axis runs softmax.wgsl."""
    x = rand(4, 33, 6, seed=3)
    got = ember.softmax(gpu(x), axis=1).numpy()
    np.testing.assert_allclose(got, ref(x, axis=1), rtol=2e-6, atol=2e-6)
    assert "softmax" in kernels and "softmax_rows" not in kernels


@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal"])
def test_gpu_attention_composite_takes_softmax_rows(monkeypatch, kernels, mask):
    """Attention with many scores on a GPU adapter runs as the scores product, one softmax_rows
    dispatch and the value product; a bool mask with fully masked rows gives zeros there (the
    composite's rule), a float mask is added, causal hides later keys."""
    monkeypatch.setattr(nn, "_cpu_adapter", lambda rt: False)
    monkeypatch.setattr(nn, "SOFTMAX_ROWS", True)
    monkeypatch.delenv("EMBER_WEBGPU_ATTN_TILED", raising=False)
    B, H, L, E = 2, 4, 72, 16
    assert B * H * L * L >= nn.ATTN_GPU_COMPOSITE_FROM
    q, k, v = (rand(B, H, L, E, seed=s) for s in range(3))
    kw, m = {}, None
    if mask == "bool":
        m = rand(B, 1, L, L, seed=7) > -0.5
        m[0, 0, 3, :] = False          # a fully masked row
    elif mask == "float":
        m = np.where(rand(B, 1, L, L, seed=8) > 1.0, -1e9, 0.0).astype(np.float32)
    elif mask == "causal":
        kw = {"is_causal": True}
    args = (gpu(q), gpu(k), gpu(v)) + (() if m is None else (gpu(m),))
    got = ember.scaled_dot_product_attention(*args, **kw).numpy()
    np.testing.assert_allclose(got, _np_sdpa(np, q, k, v, m, causal=mask == "causal"), rtol=1e-5, atol=2e-6)
    assert "softmax_rows" in kernels and "attention" not in kernels, kernels
    if mask == "bool":
        assert not got[0, :, 3].any()


def test_gpu_attention_composite_without_softmax_rows(monkeypatch, kernels):
    """EMBER_WEBGPU_SOFTMAX_ROWS=0: the registry's composite (max, exp and sum, divide) runs."""
    monkeypatch.setattr(nn, "_cpu_adapter", lambda rt: False)
    monkeypatch.setattr(nn, "SOFTMAX_ROWS", False)
    q, k, v = (rand(2, 4, 72, 16, seed=s) for s in range(3))
    m = rand(2, 1, 72, 72, seed=7) > -0.5
    got = ember.scaled_dot_product_attention(gpu(q), gpu(k), gpu(v), gpu(m)).numpy()
    np.testing.assert_allclose(got, _np_sdpa(np, q, k, v, m), rtol=1e-5, atol=2e-6)
    assert "softmax_rows" not in kernels
