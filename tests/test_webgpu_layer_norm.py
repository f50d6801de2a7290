"""webgpu's layer_norm kernels against a float64 numpy layer_norm: ``layer_norm_rows.wgsl`` (each
row read once into registers, several rows to a workgroup where rows are short) and the earlier
``layer_norm.wgsl`` (a workgroup per row; ``EMBER_WEBGPU_LN_ROWS=0``, and rows too long for the
first), both within 1e-5 of the reference. Widths on every path of ``ln_rows_shape`` (vec4 and
scalar units, 1 to 256 lanes, rows over its limit), views that start mid-buffer (4-aligned and
not: read in place), eps, weights and biases that are not ones / zeros, reductions with and
without subgroup shuffles, and rows with a large mean (x ~ 1e4 + noise), where the two-pass
variance keeps its accuracy and E[x^2] - E[x]^2 would not. Skipped where no adapter exists."""
from __future__ import annotations

import numpy as np
import pytest

import ember

from conftest import webgpu_only

_REASON, pytestmark = webgpu_only()

if _REASON is None:
    import ember.webgpu as wg
    from ember.webgpu import nn

WIDTHS = [1, 3, 32, 96, 384, 385, 1000, 4096, 5000, 5001]
ROWS = [1, 7, 512]
TOL = 1e-5


@pytest.fixture(params=["rows", "old"])
def kernel(request, monkeypatch):
    """Each test once with layer_norm_rows.wgsl (where the width allows) and once with the
    earlier kernel (nn.LN_ROWS, the value EMBER_WEBGPU_LN_ROWS sets at import)."""
    monkeypatch.setattr(nn, "LN_ROWS", request.param == "rows")
    monkeypatch.setattr(nn, "LN_ROWS_LANES", 256)     # (every width the kernel takes, not only the default's)
    return request.param


def _ref(x, w, b, eps):
    """float64 layer_norm over the last axis of ``x`` (mean, then the mean square of the
    differences: the definition)."""
    x = np.asarray(x, np.float64)
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * w + b


def _data(rows, D, seed, loc=0.5, scale=2.0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, D)) * scale + loc).astype(np.float32)
    w = (rng.standard_normal(D) * 0.5 + 1).astype(np.float32)
    b = rng.standard_normal(D).astype(np.float32)
    return x, w, b


def _run(x, w, b, eps, D):
    g = lambda a: ember.from_numpy(a, device="webgpu")   # noqa: E731
    return ember.layer_norm(x if isinstance(x, ember.Tensor) else g(x), (D,), g(w), g(b), eps=eps).numpy()


@pytest.mark.parametrize("D", WIDTHS)
@pytest.mark.parametrize("rows", ROWS)
def test_matches_float64(kernel, D, rows):
    x, w, b = _data(rows, D, seed=D * 7 + rows)
    eps = 1e-3
    got = _run(x, w, b, eps, D)
    assert got.shape == (rows, D) and got.dtype == np.float32
    np.testing.assert_allclose(got, _ref(x, w, b, eps), rtol=0, atol=TOL)


@pytest.mark.parametrize("D", [96, 385, 4096, 5001])
@pytest.mark.parametrize("start", [1, 4, 6])
def test_view_starting_mid_buffer(kernel, D, start):
    """A contiguous view at element ``start`` of its buffer: read in place (one dispatch, no
    copy) at a 4-aligned offset (vec4 loads) and at an unaligned one (scalar loads)."""
    rows = 7
    rng = np.random.default_rng(D + start)
    flat = (rng.standard_normal(rows * D + 9) * 3 - 1).astype(np.float32)
    _, w, b = _data(1, D, seed=start)
    base = ember.from_numpy(flat, device="webgpu")
    v = base[start:start + rows * D].reshape((rows, D))
    want = _ref(flat[start:start + rows * D].reshape(rows, D), w, b, 1e-5)
    np.testing.assert_allclose(_run(v, w, b, 1e-5, D), want, rtol=0, atol=TOL)
    gw, gb = (ember.from_numpy(a, device="webgpu") for a in (w, b))
    ember.layer_norm(v, (D,), gw, gb).numpy()
    wg.reset_stats()
    ember.layer_norm(v, (D,), gw, gb).numpy()
    assert wg.stats()["dispatches"] == 1


def test_leading_axes_and_a_multi_axis_norm(kernel):
    x, w, b = _data(2 * 3 * 4, 96, seed=3)
    g = lambda a: ember.from_numpy(a, device="webgpu")   # noqa: E731
    got = ember.layer_norm(g(x.reshape(2, 3, 4, 96)), (4, 96), g(w.repeat(4).reshape(4, 96)),
                           g(b.repeat(4).reshape(4, 96)), eps=1e-4).numpy()
    want = _ref(x.reshape(6, 384), w.repeat(4), b.repeat(4), 1e-4).reshape(2, 3, 4, 96)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


@pytest.mark.parametrize("D", [32, 385, 1000, 4096])
def test_without_subgroup_shuffles(monkeypatch, D):
    """EMBER_WEBGPU_SUBGROUPS=0: the row sums by workgroup-memory trees alone."""
    monkeypatch.setattr(nn, "LN_ROWS", True)
    monkeypatch.setattr(nn, "LN_ROWS_LANES", 256)
    monkeypatch.setenv("EMBER_WEBGPU_SUBGROUPS", "0")
    x, w, b = _data(7, D, seed=D)
    np.testing.assert_allclose(_run(x, w, b, 1e-5, D), _ref(x, w, b, 1e-5), rtol=0, atol=TOL)


@pytest.mark.parametrize("D", [384, 385, 4096])
def test_large_mean_keeps_two_pass_accuracy(kernel, D):
    """x ~ 1e4 + N(0, 1): float32 holds x to 1e4's spacing (~1e-3), so the mean, and the
    output, cannot be closer than about that over the noise's unit spread; the bound is 2 such
    spacings. E[x^2] - E[x]^2 in float32 misses by O(1) (x^2 ~ 1e8 is held to ~8): checked here
    too, so the bound is one that a one-pass variance fails."""
    x, w, b = _data(7, D, seed=D + 1, loc=1e4, scale=1.0)
    want = _ref(x, w, b, 1e-5)
    tol = 2 * float(np.spacing(np.float32(1e4))) * float(np.abs(w).max())
    np.testing.assert_allclose(_run(x, w, b, 1e-5, D), want, rtol=0, atol=tol)
    m = x.mean(-1, keepdims=True, dtype=np.float32)
    var1 = np.maximum((x * x).mean(-1, keepdims=True, dtype=np.float32) - m * m, 0)
    one_pass = (x - m) / np.sqrt(var1 + np.float32(1e-5)) * w + b
    assert np.abs(one_pass - want).max() > 10 * tol


def test_rows_kernel_shape():
    """ln_rows_shape: (vec4 units, lanes per row, units per lane, workgroup size)."""
    assert nn.ln_rows_shape(384) == (True, 32, 3, 64)       # MiniLM: 32 lanes of 3 vec4s
    assert nn.ln_rows_shape(768) == (True, 32, 6, 64)
    assert nn.ln_rows_shape(32) == (True, 8, 1, 64)         # 8 rows a workgroup
    assert nn.ln_rows_shape(3) == (False, 4, 1, 64)
    assert nn.ln_rows_shape(385) == (False, 32, 13, 64)
    assert nn.ln_rows_shape(4096) == (True, 128, 8, 128)
    assert nn.ln_rows_shape(8192) == (True, 256, 8, 256)
    assert nn.ln_rows_shape(8196) is None and nn.ln_rows_shape(5001) is None


def test_long_rows_take_the_row_per_workgroup_kernel_by_default():
    """By default layer_norm_rows.wgsl takes rows of up to 32 lanes (D <= 1024 in vec4s): an H100
    measured it slower than layer_norm.wgsl at D = 4096 (128 lanes a row)."""
    assert nn.LN_ROWS_LANES == 32
    if nn.LN_ROWS:
        assert nn.ln_rows_used(384) == (True, 32, 3, 64) and nn.ln_rows_used(1024) == (True, 32, 8, 64)
    assert nn.ln_rows_used(2048) is None and nn.ln_rows_used(4096) is None
