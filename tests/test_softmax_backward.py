"""softmax_backward (the gradient of softmax from its output as one op) on every backend against
float64 numpy, along first, middle and last axes, lines longer than a workgroup; the softmax and
attention gradients that use it (attention without a mask recomputes its probabilities with the
softmax op), and webgpu's one-dispatch row kernel."""
from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.errors import ShapeError
from ember.registry import apply

from conftest import available




def _softmax64(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _close(got, ref):
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=2e-4, atol=2e-5 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("device", available("python", "numpy", "webgpu"))
@pytest.mark.parametrize("shape,axis", [((7,), 0), ((3, 5), 1), ((4, 33, 6), 1), ((300, 4), 0),
                                        ((2, 3, 513), -1), ((5, 128), 1)])
def test_softmax_backward_matches_float64(device, shape, axis):
    rng = np.random.default_rng(len(shape) + shape[-1])
    y = _softmax64(rng.standard_normal(shape) * 2, axis).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    got = apply("softmax_backward", ember.tensor(g, device=device), ember.tensor(y, device=device), axis=axis)
    y64, g64 = y.astype(np.float64), g.astype(np.float64)
    _close(got.numpy(), y64 * (g64 - (g64 * y64).sum(axis, keepdims=True)))


@pytest.mark.parametrize("device", available("python", "numpy", "webgpu"))
def test_softmax_gradient_through_autograd(device):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9, 4)).astype(np.float32)
    c = rng.standard_normal((3, 9, 4)).astype(np.float32)
    tx = ember.tensor(x, device=device, requires_grad=True)
    (ember.softmax(tx, axis=1) * ember.tensor(c, device=device)).sum().backward()
    y = _softmax64(x.astype(np.float64), 1)
    _close(tx.grad.numpy(), y * (c - (c * y).sum(1, keepdims=True)))


def _attention_grads64(q, k, v, c, scale, mask=None):
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = _softmax64(s, -1)
    gp = c @ np.swapaxes(v, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True))
    return gs @ k * scale, np.swapaxes(gs, -1, -2) @ q * scale, np.swapaxes(p, -1, -2) @ c


@pytest.mark.parametrize("device", ["numpy", "webgpu"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients_match_float64(device, causal):
    if device not in available("python", "numpy", "webgpu"):
        pytest.skip("webgpu backend unavailable")
    rng = np.random.default_rng(2)
    q, k, v, c = (rng.standard_normal((2, 3, 20, 8)).astype(np.float32) for _ in range(4))
    t = [ember.tensor(a, device=device, requires_grad=True) for a in (q, k, v)]
    out = ember.scaled_dot_product_attention(*t, is_causal=causal)
    (out * ember.tensor(c, device=device)).sum().backward()
    mask = np.tril(np.ones((20, 20), bool)) if causal else None
    ref = _attention_grads64(*(a.astype(np.float64) for a in (q, k, v, c)), 1 / np.sqrt(8), mask)
    for a, b in zip(t, ref):
        _close(a.grad.numpy(), b)


def test_softmax_backward_bad_shapes_are_typed_errors():
    with pytest.raises(ShapeError, match="softmax_backward"):
        apply("softmax_backward", ember.ones((2, 3)), ember.ones((3, 2)), axis=1)
    with pytest.raises(ShapeError):
        apply("softmax_backward", ember.ones((2, 3)), ember.ones((2, 3)), axis=2)


def test_webgpu_softmax_backward_is_one_dispatch():
    if "webgpu" not in available("python", "numpy", "webgpu"):
        pytest.skip("webgpu backend unavailable")
    from ember.webgpu.runtime import get_runtime

    rt = get_runtime()
    rng = np.random.default_rng(4)
    y = ember.tensor(_softmax64(rng.standard_normal((8, 12, 128, 128)), -1).astype(np.float32), device="webgpu")
    g = ember.tensor(rng.standard_normal((8, 12, 128, 128)).astype(np.float32), device="webgpu")
    rt.driver.flush()
    d0 = rt.stats["dispatches"]
    r = apply("softmax_backward", g, y, axis=3)
    r.numpy()
    assert rt.stats["dispatches"] - d0 == 1
