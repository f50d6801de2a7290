"""Autodiff: every gradient rule against PyTorch's (golden file from torch.autograd in float64,
tests/golden/make_grad_goldens.py) on every backend, finite-difference checks over random
shapes, and the graph API (no_grad, detach, accumulation, retain_graph, errors)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ember
from ember.autograd import AutogradError
from grad_cases import CASES

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "grad_ops.safetensors")
_SD = {}

def golden():
    if not _SD:
        _SD.update(ember.load_safetensors(GOLDEN, device="python"))
    return _SD


def _run_case(case, device):
    sd = golden()
    xs = []
    for k, spec in enumerate(case.inputs):
        t = sd[f"{case.name}/in{k}"].to(device)
        if spec[0] in ("f", "pos", "far"):
            t = t.detach().requires_grad_()
        xs.append(t)
    y = case.ember(ember, *xs)
    up = sd[f"{case.name}/up"].to(device)
    assert y.shape == up.shape, f"{case.name}: output shape {y.shape}, torch's {up.shape}"
    y.backward(up)
    return xs


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradient_matches_torch(case, device):
    xs = _run_case(case, device)
    sd = golden()
    tol = case.tol * (10 if device == "webgpu" else 1)
    for k, (x, spec) in enumerate(zip(xs, case.inputs)):
        if spec[0] not in ("f", "pos", "far"):
            continue
        want = sd[f"{case.name}/grad{k}"].numpy()
        assert x.grad is not None, f"{case.name} on {device}: input {k} got no gradient"
        assert x.grad.device == device and x.grad.shape == x.shape and x.grad.dtype == x.dtype
        got = x.grad.numpy()
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=tol * 10, atol=tol * scale,
                                   err_msg=f"{case.name} on {device}: gradient of input {k}")


# ---- finite differences over random shapes (python computes in float64 between stores) -----------

def numeric_grad(fn, arrays, k, eps=1e-2):
    """Central differences of sum(fn(*arrays) * up) wrt arrays[k], in float64 via the numpy
    reference ``fn`` (numpy functions of float64 arrays)."""
    base = [a.astype(np.float64) for a in arrays]
    up = np.random.default_rng(0).standard_normal(np.shape(fn(*base)))
    g = np.zeros_like(base[k])
    it = np.nditer(base[k], flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        plus = [a.copy() for a in base]
        minus = [a.copy() for a in base]
        plus[k][i] += eps
        minus[k][i] -= eps
        g[i] = ((fn(*plus) * up).sum() - (fn(*minus) * up).sum()) / (2 * eps)
    return g, up


def ember_grad(fn, arrays, k, up, device):
    xs = [ember.tensor(a.astype(np.float32), device=device) for a in arrays]
    xs[k].requires_grad_()
    y = fn(*xs)
    y.backward(ember.tensor(up.astype(np.float32), device=device))
    return xs[k].grad.numpy()


shapes2 = st.tuples(st.integers(1, 3), st.integers(1, 4))


@settings(max_examples=15, deadline=None)
@given(a=shapes2, b=shapes2, seed=st.integers(0, 1000), op=st.sampled_from(["add", "mul", "div", "max"]))
def test_broadcast_binary_numeric(a, b, seed, op):
    # broadcast-compatible shapes: make every pair of dims equal or 1
    b = tuple(x if (x == y or x == 1 or y == 1) else 1 for x, y in zip(b, a))
    rng = np.random.default_rng(seed)
    xa, xb = rng.standard_normal(a), rng.uniform(0.5, 2.0, b) * rng.choice([-1, 1], b)
    fns = {"add": (lambda p, q: p + q, lambda p, q: p + q), "mul": (lambda p, q: p * q, lambda p, q: p * q),
           "div": (lambda p, q: p / q, lambda p, q: p / q),
           "max": (lambda p, q: ember.maximum(p, q), lambda p, q: np.maximum(p, q))}
    e, n = fns[op]
    for k in (0, 1):
        want, up = numeric_grad(n, [xa, xb], k, eps=1e-4 if op == "max" else 1e-3)
        got = ember_grad(e, [xa, xb], k, up, "numpy")
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), seed=st.integers(0, 1000),
       data=st.data())
def test_slices_numeric(shape, seed, data):
    x = np.random.default_rng(seed).standard_normal(shape)
    key = tuple(slice(data.draw(st.integers(-n, n)), data.draw(st.integers(-n - 1, n + 1)),
                      data.draw(st.sampled_from([1, 2, 3, -1, -2]))) for n in shape)
    fn = lambda t: t[key] * 2.0  # noqa: E731
    want, up = numeric_grad(lambda a: a[key] * 2.0, [x], 0)
    if up.size == 0:
        return
    got = ember_grad(fn, [x], 0, up, "python")
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(3, 6), k=st.integers(1, 3),
       s=st.integers(1, 2), p=st.integers(0, 1), seed=st.integers(0, 1000))
def test_conv2d_numeric(n, c, h, k, s, p, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((n, c, h, h + 1)), rng.standard_normal((2, c, k, k))

    def ref(a, b):  # direct convolution in float64
        a = np.pad(a, ((0, 0), (0, 0), (p, p), (p, p)))
        oh, ow = (a.shape[2] - k) // s + 1, (a.shape[3] - k) // s + 1
        out = np.zeros((a.shape[0], b.shape[0], oh, ow))
        for i in range(oh):
            for j in range(ow):
                out[:, :, i, j] = np.einsum("ncij,ocij->no", a[:, :, i * s:i * s + k, j * s:j * s + k], b)
        return out

    for idx in (0, 1):
        want, up = numeric_grad(ref, [x, w], idx)
        got = ember_grad(lambda a, b: ember.conv2d(a, b, stride=s, padding=p), [x, w], idx, up, "numpy")
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


# ---- the graph API -----------------------------------------------------------------------------

def test_nothing_recorded_without_requires_grad(device):
    x = ember.tensor([1.0, 2.0], device=device)
    y = (x * 2).exp()
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf


def test_no_grad_and_enable_grad():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    with ember.no_grad():
        y = x * 2
        with ember.enable_grad():
            z = x * 3
        assert not ember.is_grad_enabled()
    assert ember.is_grad_enabled()
    assert not y.requires_grad and z.requires_grad

    @ember.no_grad()
    def f(t):
        return t * t
    assert not f(x).requires_grad
    with ember.set_grad_enabled(False):
        assert not (x * 1).requires_grad
    assert (x * 1).requires_grad


def test_accumulation_and_zeroing(device):
    x = ember.tensor([1.0, -2.0, 3.0], requires_grad=True, device=device)
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    assert x.grad.tolist() == [5.0, -1.0, 9.0]
    assert x.grad.device == device
    x.grad = None
    (x.sum()).backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_detach_and_leaf_rules():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert not y.is_leaf and y.grad_fn is not None and "multiply" in repr(y.grad_fn)
    d = y.detach()
    assert not d.requires_grad and d.tolist() == [2.0, 4.0]
    with pytest.raises(AutogradError):
        y.requires_grad_(False)
    with pytest.raises(AutogradError):
        ember.tensor([1, 2]).requires_grad_()
    assert "requires_grad=True" in repr(x)


def test_backward_errors_and_retain_graph():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).exp()
    with pytest.raises(AutogradError, match="single value"):
        y.backward()
    s = y.sum()
    s.backward(retain_graph=True)
    s.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * 2 * np.array([1.0, 2.0]) * np.exp([1.0, 4.0]), rtol=1e-5)
    with pytest.raises(AutogradError, match="second time"):
        s.backward()
    with pytest.raises(AutogradError):
        ember.tensor([1.0]).backward()


def test_functional_grad_and_retain_grad():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3.0
    h.retain_grad()
    y = (h * h).sum()
    (gx,) = ember.autograd.grad(y, x, retain_graph=True)
    assert gx.tolist() == [18.0, 36.0] and x.grad is None
    y.backward()
    assert h.grad.tolist() == [6.0, 12.0] and x.grad.tolist() == [18.0, 36.0]


def test_shared_input_diamond_and_unused_branch():
    x = ember.tensor([0.5, -1.0], requires_grad=True)
    w = ember.tensor([2.0, 3.0], requires_grad=True)
    a = x * w
    _ = a.exp()                    # a branch that never reaches the loss
    loss = (a + a * a).sum()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), (1 + 2 * np.array([1.0, -3.0])) * np.array([2.0, 3.0]))
    assert w.grad is not None


def test_device_move_is_differentiable():
    x = ember.tensor([1.0, 2.0], requires_grad=True)
    y = (x.to("numpy") * 2.0).sum()
    y.backward()
    assert x.grad.device == "python" and x.grad.tolist() == [2.0, 2.0]


def test_multi_output_sort_indices_have_no_grad():
    x = ember.tensor([3.0, 1.0, 2.0], requires_grad=True)
    v, i = ember.topk(x, 2)
    assert v.requires_grad and not i.requires_grad
    (v * ember.tensor([1.0, 10.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 10.0]


def test_compile_still_captures_with_parameters():
    w = ember.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    f = ember.compile(lambda x: ember.relu(x @ w))
    a = f(ember.tensor([[1.0, -1.0]]))
    b = f(ember.tensor([[2.0, 1.0]]))
    assert a.tolist() == [[0.0, 0.0]] and b.tolist() == [[5.0, 8.0]]


def test_gelu_gradient_near_zero_and_in_the_tails(device):
    # the rule divides the output by x away from 0 and uses the series near 0: both sides and
    # the switch point must agree with the exact derivative Phi(x) + x phi(x)
    import math

    v = [0.0, 1e-4, -1e-4, 5e-4, -9e-4, 1.1e-3, -3.0, -30.0, 30.0, 2.5]
    x = ember.tensor(v, requires_grad=True, device=device)
    ember.gelu(x).sum().backward()
    want = [0.5 * (1 + math.erf(a / math.sqrt(2))) + a * math.exp(-a * a / 2) / math.sqrt(2 * math.pi) for a in v]
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-5, atol=1e-6)
