"""layer_norm_backward (the gradient of layer_norm as one op): every backend against a float64
numpy formula, through ``apply`` and through autograd; webgpu's row kernel (a block of rows per
workgroup, partial column sums reduced after) with odd widths, widths over a workgroup, rows over
one block, offset views and lazy gradients, and its dispatch count."""
from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.errors import ShapeError
from ember.registry import apply

from conftest import available


def _ref(g, x, w, k, eps):
    """float64 (dx, dweight, dbias) of layer norm over the trailing ``k`` axes."""
    g, x, w = (np.asarray(a, np.float64) for a in (g, x, w))
    ax = tuple(range(x.ndim - k, x.ndim))
    outer = tuple(range(x.ndim - k))
    d = x - x.mean(ax, keepdims=True)
    r = 1.0 / np.sqrt((d * d).mean(ax, keepdims=True) + eps)
    xh = d * r
    gh = g * w
    gx = r * (gh - gh.mean(ax, keepdims=True) - xh * (gh * xh).mean(ax, keepdims=True))
    return gx, (g * xh).sum(outer), g.sum(outer)


def _data(shape, k, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal(shape[len(shape) - k:]).astype(np.float32)
    return g, x, w


def _check(got, ref, width):
    for a, b in zip(got, ref):
        np.testing.assert_allclose(np.asarray(a.numpy(), np.float64), b, rtol=2e-4,
                                   atol=2e-5 * max(1.0, np.sqrt(width)) * max(1.0, np.abs(b).max()))




# (shape, normalized axes): odd widths, a width over a workgroup (128 / 256 threads), rows over
# one block of rows (webgpu: about 256 blocks), two normalized axes, a single row
CASES = [((3, 5), 1), ((2, 7, 33), 1), ((4, 384), 1), ((1, 1000), 1), ((3, 2, 5, 6), 2),
         ((1100, 17), 1), ((9000, 3), 1), ((6,), 1)]


# (the many-block shapes are there for webgpu's row blocks: not run on the pure-Python backend)
@pytest.mark.parametrize("device,shape,k", [(d, s, k) for d in available("python", "numpy", "webgpu") for s, k in CASES
                                            if d != "python" or np.prod(s) <= 5000])
def test_layer_norm_backward_matches_float64(device, shape, k):
    g, x, w = _data(shape, k, seed=len(shape) + shape[-1])
    ns = tuple(shape[len(shape) - k:])
    t = [ember.tensor(a, device=device) for a in (g, x, w)]
    got = apply("layer_norm_backward", *t, normalized_shape=ns, eps=1e-5)
    assert [o.shape for o in got] == [shape, ns, ns]
    _check(got, _ref(g, x, w, k, 1e-5), np.prod(ns))


@pytest.mark.parametrize("device", available("python", "numpy", "webgpu"))
def test_layer_norm_gradients_through_autograd(device):
    """x, weight and bias gradients of a layer norm inside a graph (the gradient reaching it is
    a lazy expression on webgpu), and weight/bias only (x needs no gradient: the composite's
    other branch)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 3, 40)).astype(np.float32)
    w = rng.standard_normal(40).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    c = rng.standard_normal((5, 3, 40)).astype(np.float32)
    for need_x in (True, False):
        tx = ember.tensor(x, device=device, requires_grad=need_x)
        tw = ember.tensor(w, device=device, requires_grad=True)
        tb = ember.tensor(b, device=device, requires_grad=True)
        y = ember.layer_norm(tx, 40, tw, tb, eps=1e-3)
        (y * ember.tensor(c, device=device)).sum().backward()
        gx, gw, gb = _ref(c, x, w, 1, 1e-3)
        if need_x:
            _check([tx.grad], [gx], 40)
        else:
            assert tx.grad is None
        _check([tw.grad, tb.grad], [gw, gb], 40)


def test_layer_norm_backward_bad_shapes_are_typed_errors():
    g, x, w = (ember.tensor(a) for a in _data((2, 4), 1))
    with pytest.raises(ShapeError, match="layer_norm_backward"):
        apply("layer_norm_backward", ember.ones((2, 3)), x, w, normalized_shape=(4,), eps=1e-5)
    with pytest.raises(ShapeError, match="layer_norm"):
        apply("layer_norm_backward", g, x, ember.ones((3,)), normalized_shape=(4,), eps=1e-5)


def test_webgpu_layer_norm_backward_dispatches(rt):
    """The encoder's layer norm backward (1024 rows of 384): the row kernel and the partials'
    column sum, against the composite's ~10 dispatches."""
    g, x, w = (ember.tensor(a, device="webgpu") for a in _data((8, 128, 384), 1, seed=4))
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    dx, dw, db = apply("layer_norm_backward", g, x, w, normalized_shape=(384,), eps=1e-5)
    for t in (dx, dw, db):
        t.numpy()
    assert rt.stats["dispatches"] - d0 <= 3


def test_webgpu_layer_norm_backward_reads_views_and_lazy_inputs(rt):
    """Offset views (a slice of a larger buffer) and a lazy gradient expression are read right."""
    g, x, w = _data((2, 70, 300), 1, seed=6)
    big = np.concatenate([np.zeros((2, 1, 300), np.float32), x], axis=1)
    tx = ember.tensor(big, device="webgpu")[:, 1:]
    tg = ember.tensor(g, device="webgpu") * 2.0
    tw = ember.tensor(np.concatenate([[5.0], w]).astype(np.float32), device="webgpu")[1:]
    got = apply("layer_norm_backward", tg, tx, tw, normalized_shape=(300,), eps=1e-5)
    _check(got, _ref(2 * g, x, w, 1, 1e-5), 300)


def test_webgpu_layer_norm_backward_float16_falls_back(rt):
    g, x, w = _data((3, 9), 1, seed=8)
    t = [ember.tensor(a, device="webgpu", dtype=ember.float16) for a in (g, x, w)]
    got = apply("layer_norm_backward", *t, normalized_shape=(9,), eps=1e-5)
    ref = _ref(*(a.astype(np.float16) for a in (g, x, w)), 1, 1e-5)
    for a, b in zip(got, ref):
        assert a.dtype == ember.float16
        np.testing.assert_allclose(a.numpy().astype(np.float64), b, rtol=2e-2, atol=2e-2 * max(1, np.abs(b).max()))
