"""The numpy backend's training kernels against their references: the fused optimizer steps
(``ember.backends.numpy_optim``) bit for bit against the reference ops (``Optimizer._update``,
the same rule through the registry), and the backward kernels against the ops they replace
(the composite's decomposition, on the same device) and against plain numpy math."""
from __future__ import annotations

import numpy as np
import pytest

import ember
from ember import optim
from ember.optim import optimizer as _opt
from ember.registry import apply

CONFIGS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.001)),
    ("SGD", dict(lr=0.1, momentum=0.5, maximize=True, weight_decay=0.02)),
    ("Adam", dict(lr=0.01)),
    ("Adam", dict(lr=0.005, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=0.003, weight_decay=0.05, maximize=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, amsgrad=True, maximize=True)),
]
SHAPES = [(), (3,), (4, 5), (2, 3, 2, 2)]


def _trajectory(cls, kw, fused, dtype="float32", steps=5, seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    params = [ember.tensor(rng.standard_normal(s).astype(dtype), dtype=dtype, device="numpy").requires_grad_() for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    opt = getattr(optim, cls)(params, **kw)
    old = _opt._FUSED[0]
    _opt._FUSED[0] = fused
    try:
        out = []
        for k in range(steps):
            for p, g in zip(params, grads[k]):
                p.grad = ember.tensor(g, dtype=dtype, device="numpy")
            opt.step()
            out.append([p.numpy().copy() for p in params])
    finally:
        _opt._FUSED[0] = old
    return out, opt, params


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cls,kw", CONFIGS, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CONFIGS)])
def test_fused_numpy_step_is_bit_identical_to_the_reference_ops(cls, kw, dtype):
    fused, opt_f, ps = _trajectory(cls, kw, True, dtype)
    ref, opt_r, _ = _trajectory(cls, kw, False, dtype)
    for k, (a, b) in enumerate(zip(fused, ref)):
        for i, (x, y) in enumerate(zip(a, b)):
            assert x.dtype == y.dtype == np.dtype(dtype) and x.shape == y.shape
            np.testing.assert_array_equal(x, y, err_msg=f"{cls} {kw} step {k} param {i}")
    for p, q in zip(opt_f.state, opt_r.state):
        sf, sr = opt_f.state[p], opt_r.state[q]
        assert sorted(sf) == sorted(sr)
        for key in sf:
            if isinstance(sf[key], ember.Tensor):
                assert sf[key].shape == sr[key].shape and sf[key].device == "numpy"
                np.testing.assert_array_equal(sf[key].numpy(), sr[key].numpy(), err_msg=key)
            else:
                assert sf[key] == sr[key]
    assert all(p.device == "numpy" and p.requires_grad and p.is_leaf for p in ps)


def test_fused_step_is_taken_and_keeps_value_semantics(monkeypatch):
    """The numpy step goes through numpy_optim (no registry op), writes no array that existed
    before (a detached alias of the parameter, the gradient and saved state keep their values)."""
    p = ember.tensor([1.0, 2.0, 3.0], device="numpy").requires_grad_()
    opt = optim.Adam([p], lr=0.1, amsgrad=True)
    p.grad = ember.tensor([0.5, -1.0, 2.0], device="numpy")
    opt.step()
    before, grad = p.detach(), p.grad
    saved = {k: (v.numpy().copy(), v) for k, v in opt.state[p].items() if isinstance(v, ember.Tensor)}
    sd = opt.state_dict()
    calls = []
    kernels = ember.get_backend("numpy").kernels
    for name, k in list(kernels.items()):
        monkeypatch.setitem(kernels, name, lambda *a, _k=k, _n=name, **kw: calls.append(_n) or _k(*a, **kw))
    old = p.numpy().copy()
    opt.step()
    monkeypatch.undo()
    assert calls == [], calls
    assert before.numpy().tolist() == old.tolist() and not np.array_equal(p.numpy(), old)
    assert grad.tolist() == [0.5, -1.0, 2.0]
    for k, (vals, t) in saved.items():
        np.testing.assert_array_equal(t.numpy(), vals, err_msg=k)
        np.testing.assert_array_equal(sd["state"][0][k].numpy(), vals, err_msg=k)
    assert not np.array_equal(opt.state[p]["exp_avg"].numpy(), saved["exp_avg"][0])


def test_loaded_and_foreign_state_follow_the_reference():
    """State loaded from another optimizer (or on another device) gives the reference values;
    float16 parameters take the reference ops."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    gs = [rng.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
    runs = {}
    for fused in (True, False):
        old = _opt._FUSED[0]
        _opt._FUSED[0] = fused
        try:
            a = ember.tensor(w, device="numpy").requires_grad_()
            oa = optim.AdamW([a], lr=0.01, amsgrad=True)
            for g in gs[:2]:
                a.grad = ember.tensor(g, device="numpy")
                oa.step()
            b = ember.tensor(a.numpy(), device="python").requires_grad_()
            ob = optim.AdamW([b], lr=0.01, amsgrad=True)
            sd = oa.state_dict()
            sd["state"] = {k: {n: (v.to("python") if isinstance(v, ember.Tensor) else v) for n, v in s.items()}
                           for k, s in sd["state"].items()}
            ob.load_state_dict(sd)
            c = ember.tensor(a.numpy(), device="numpy").requires_grad_()
            oc = optim.AdamW([c], lr=0.01, amsgrad=True)
            oc.load_state_dict(oa.state_dict())
            for g in gs[2:]:
                c.grad = ember.tensor(g, device="numpy")
                oc.step()
                a.grad = ember.tensor(g, device="numpy")
                oa.step()
            runs[fused] = (a.numpy(), c.numpy())
        finally:
            _opt._FUSED[0] = old
    for x, y in zip(runs[True], runs[False]):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(runs[True][0], runs[True][1])
    h = ember.tensor([1.0, 2.0], dtype="float16", device="numpy").requires_grad_()
    oh = optim.Adam([h], lr=0.1)
    h.grad = ember.tensor([1.0, 1.0], dtype="float16", device="numpy")
    oh.step()
    assert h.dtype == ember.float16 and h.tolist() == pytest.approx([0.9, 1.9], abs=2e-3)


# ---- backward kernels against the decompositions they replace -----------------------------------

def _decomposed(name, *args, **attrs):
    from ember.registry import OPS
    with ember.no_grad():
        return OPS[name].decompose(*args, **attrs)


def _np(t):
    return t.numpy().astype(np.float64)


BN_SHAPES = [(8, 3), (4, 5, 7), (6, 4, 5, 3), (2, 1, 3, 4), (3, 2, 2, 3, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_train_kernels_match_the_decomposition_and_numpy(shape, dtype):
    rng = np.random.default_rng(len(shape) * 10 + shape[1])
    c = shape[1]
    xa = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    ga = rng.standard_normal(shape).astype(dtype)
    wa, ba = (rng.standard_normal(c) + 1).astype(dtype), rng.standard_normal(c).astype(dtype)
    x, g, w, b = (ember.tensor(a, dtype=dtype, device="numpy") for a in (xa, ga, wa, ba))
    kernels = ember.get_backend("numpy").kernels
    assert "batch_norm_train" in kernels and "batch_norm_train_backward" in kernels
    with ember.no_grad():
        got = ember.batch_norm_train(x, w, b, eps=1e-5)
    want = _decomposed("batch_norm_train", x, w, b, eps=1e-5)
    tol = {"float16": 2e-3, "float32": 2e-5, "float64": 1e-12}[dtype]
    for a, e in zip(got, want):
        assert a.dtype is e.dtype and a.shape == e.shape
        np.testing.assert_allclose(_np(a), _np(e), rtol=tol, atol=tol * 10)
    # plain numpy, in float64
    axes = (0,) + tuple(range(2, len(shape)))
    bshape = (1, c) + (1,) * (len(shape) - 2)
    X = xa.astype(np.float64)
    mean, var = X.mean(axis=axes), X.var(axis=axes)
    Y = (X - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + 1e-5) * wa.reshape(bshape) + ba.reshape(bshape)
    for a, e in zip(got, (Y, mean, var)):
        np.testing.assert_allclose(_np(a), e, rtol=max(tol, 1e-5), atol=max(tol, 1e-5) * 10)
    y, m, v = got
    with ember.no_grad():
        gk = apply("batch_norm_train_backward", g, x, m, v, w, eps=1e-5)
    gd = _decomposed("batch_norm_train_backward", g, x, m, v, w, eps=1e-5)
    for a, e in zip(gk, gd):
        assert a.shape == e.shape
        np.testing.assert_allclose(_np(a), _np(e), rtol=tol, atol=tol * 10 * max(1.0, float(np.abs(_np(e)).max())))
    # numpy: the gradient of sum(g * y) by the textbook formula
    G = ga.astype(np.float64)
    xhat = (X - mean.reshape(bshape)) / np.sqrt(var.reshape(bshape) + 1e-5)
    n = X.size // c
    gw, gb = (G * xhat).sum(axis=axes), G.sum(axis=axes)
    gx = (wa.reshape(bshape) / np.sqrt(var.reshape(bshape) + 1e-5)) * (G - gb.reshape(bshape) / n
                                                                        - xhat * gw.reshape(bshape) / n)
    for a, e in zip(gk, (gx, gw, gb)):
        np.testing.assert_allclose(_np(a), e, rtol=max(tol, 1e-4), atol=max(tol, 1e-4) * 10 * max(1.0, np.abs(e).max()))


def test_batch_norm_training_gradients_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    xa = rng.standard_normal((6, 4, 5, 5)).astype(np.float32) * 2 + 0.5
    up = rng.standard_normal((6, 4, 5, 5)).astype(np.float32)
    bn = ember.nn.BatchNorm2d(4, device="numpy")
    bn.weight.copy_(ember.tensor(rng.standard_normal(4).astype(np.float32), device="numpy"))
    x = ember.tensor(xa, device="numpy").requires_grad_()
    y = bn(x)
    y.backward(ember.tensor(up, device="numpy"))
    tb = torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        tb.weight.copy_(torch.from_numpy(bn.weight.numpy()))
    tx = torch.from_numpy(xa).requires_grad_()
    ty = tb(tx)
    ty.backward(torch.from_numpy(up))
    for a, e in ((y, ty), (x.grad, tx.grad), (bn.weight.grad, tb.weight.grad), (bn.bias.grad, tb.bias.grad),
                 (bn.running_mean, tb.running_mean), (bn.running_var, tb.running_var)):
        np.testing.assert_allclose(a.numpy(), e.detach().numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_relu_backward_kernel_matches_the_decomposition(dtype):
    rng = np.random.default_rng(3)
    xa = rng.standard_normal((5, 7)).astype(dtype)
    xa[0, :3] = [0.0, -0.0, np.nan]
    ga = rng.standard_normal((5, 7)).astype(dtype)
    ga[1, :2] = [np.inf, -np.inf]
    x, g = (ember.tensor(a, dtype=dtype, device="numpy") for a in (xa, ga))
    with ember.no_grad():
        got = apply("relu_backward", g, x)
    want = _decomposed("relu_backward", g, x)
    assert got.dtype is want.dtype is g.dtype
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got.numpy(), ga * (xa > 0))
    # through autograd: relu's gradient is this op
    xt = ember.tensor(xa, dtype=dtype, device="numpy").requires_grad_()
    ember.relu(xt).backward(g)
    np.testing.assert_array_equal(xt.grad.numpy(), want.numpy())


# ---- malloc settings of the numpy device --------------------------------------------------------

def _glibc():
    import ctypes
    import sys
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False


def test_numpy_device_keeps_freed_memory():
    """On glibc the numpy device keeps freed blocks mapped: a loop that allocates and frees
    arrays of a few MB (a training step's activations) stops page-faulting them in again;
    EMBER_NUMPY_MALLOC=default leaves malloc alone."""
    import os
    import subprocess
    import sys

    if not _glibc():
        pytest.skip("glibc's mallopt only")
    from ember.backends import numpy_backend as nb
    ember.ones((1,), device="numpy")
    assert nb._MALLOC_TUNED[0] and nb.tune_malloc()
    import resource

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    for _ in range(3):
        a = [np.ones(1 << 20, np.float32) for _ in range(8)]      # 8 x 4 MB
        del a
    f0 = faults()
    for _ in range(10):
        a = [np.ones(1 << 20, np.float32) for _ in range(8)]
        del a
    assert faults() - f0 < 2000                                  # ~8 x 1024 x 10 pages without
    code = "import ember; ember.ones((1,), device='numpy'); from ember.backends import numpy_backend as nb; " \
           "print(nb._MALLOC_TUNED[0])"
    env = {**os.environ, "EMBER_NUMPY_MALLOC": "default"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


# ---- conv2d input gradient (stride 1: shifted rows) ---------------------------------------------

CONV_GX = [   # (n, c, h, w, o, kh, kw, ((pt, pb), (pl, pr)))
    (4, 3, 9, 7, 5, 3, 3, ((1, 1), (1, 1))),
    (2, 1, 12, 12, 4, 3, 3, ((1, 1), (1, 1))),
    (3, 4, 8, 10, 2, 2, 3, ((0, 1), (2, 0))),
    (1, 2, 6, 6, 3, 5, 5, ((2, 2), (2, 2))),
    (2, 3, 7, 5, 2, 3, 2, ((0, 0), (0, 0))),
    (2, 2, 5, 6, 3, 2, 2, ((3, 1), (0, 4))),     # padding past the kernel
    (5, 6, 4, 4, 7, 1, 3, ((0, 0), (1, 1))),
]


@pytest.mark.parametrize("case", CONV_GX, ids=str)
def test_conv2d_grad_input_matches_the_transposed_convolution(case):
    from ember.backends import numpy_grad

    n, c, h, w, o, kh, kw, pads = case
    oh, ow = h + sum(pads[0]) - kh + 1, w + sum(pads[1]) - kw + 1
    assert numpy_grad._shift_applies((n, c, h, w), (o, c, kh, kw), (n, o, oh, ow), (1, 1), pads, (1, 1), 1) == \
        (oh * ow >= 16)
    rng = np.random.default_rng(sum(case[:7]))
    g = ember.tensor(rng.standard_normal((n, o, oh, ow)).astype(np.float32), device="numpy")
    wt = ember.tensor(rng.standard_normal((o, c, kh, kw)).astype(np.float32), device="numpy")
    conv = dict(stride=(1, 1), padding=pads, dilation=(1, 1), groups=1)
    with ember.no_grad():
        got = apply("conv2d_grad_input", g, wt, input_size=(h, w), **conv)
    want = _decomposed("conv2d_grad_input", g, wt, input_size=(h, w), **conv)
    assert got.shape == want.shape == (n, c, h, w)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    # the gradient of sum(conv2d(x) * g) by brute force: every output element's window
    G, W = g.numpy().astype(np.float64), wt.numpy().astype(np.float64)
    gx = np.zeros((n, c, h + sum(pads[0]), w + sum(pads[1])))
    for i in range(kh):
        for j in range(kw):
            gx[:, :, i:i + oh, j:j + ow] += np.einsum("noyx,oc->ncyx", G, W[:, :, i, j])
    gx = gx[:, :, pads[0][0]:pads[0][0] + h, pads[1][0]:pads[1][0] + w]
    np.testing.assert_allclose(got.numpy(), gx, rtol=1e-4, atol=1e-4)


def test_mnist_cnn_gradients_match_torch():
    """One training step's gradients of the MNIST demo CNN (conv-bn-relu-pool x2, 2 Linear) on the
    numpy device against PyTorch from the same weights and batch."""
    torch = pytest.importorskip("torch")
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demos", "mnist"))
    from model import MnistNet

    ember.manual_seed(0)
    net = MnistNet().to("numpy").train()
    rng = np.random.default_rng(0)
    img = rng.random((16, 1, 28, 28), dtype=np.float32)
    lab = rng.integers(0, 10, 16)

    class TNet(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.conv1, s.bn1 = torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            s.conv2, s.bn2 = torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.BatchNorm2d(32)
            s.fc1, s.fc2 = torch.nn.Linear(1568, 64), torch.nn.Linear(64, 10)

        def forward(s, x):
            x = (x - 0.1307) / 0.3081
            x = torch.nn.functional.max_pool2d(torch.relu(s.bn1(s.conv1(x))), 2)
            x = torch.nn.functional.max_pool2d(torch.relu(s.bn2(s.conv2(x))), 2)
            return s.fc2(torch.relu(s.fc1(x.flatten(1))))

    tnet = TNet()
    tnet.load_state_dict({k: torch.from_numpy(v.numpy().copy()) for k, v in net.state_dict().items()})
    loss = ember.nn.functional.cross_entropy(net(ember.tensor(img, device="numpy")), ember.tensor(lab, device="numpy"))
    loss.backward()
    tl = torch.nn.functional.cross_entropy(tnet(torch.from_numpy(img)), torch.from_numpy(lab))
    tl.backward()
    assert loss.item() == pytest.approx(tl.item(), rel=1e-5)
    tp = dict(tnet.named_parameters())
    for name, p in net.named_parameters():
        want = tp[name].grad.numpy()
        np.testing.assert_allclose(p.grad.numpy(), want, rtol=1e-3, atol=1e-5 * max(1.0, np.abs(want).max()),
                                   err_msg=name)


# ---- max_pool2d over windows that tile the input --------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "uint8"])
@pytest.mark.parametrize("shape,k", [((4, 3, 8, 8), (2, 2)), ((2, 5, 9, 6), (3, 3)), ((3, 2, 8, 6), (4, 3)),
                                     ((2, 2, 5, 6), (1, 2)), ((1, 1, 2, 2), (2, 2))], ids=str)
def test_max_pool2d_tiled_matches_numpy(shape, k, dtype):
    rng = np.random.default_rng(shape[2] * 7 + k[0])
    if dtype.startswith("float"):
        xa = rng.standard_normal(shape).astype(dtype)
        xa.reshape(-1)[::7] = np.nan
        xa.reshape(-1)[3::11] = -np.inf
    else:
        xa = rng.integers(0, 100, shape).astype(dtype)
    x = ember.tensor(xa, dtype=dtype, device="numpy")
    got = ember.max_pool2d(x, k).numpy()
    n, c, h, w = shape
    want = xa.reshape(n, c, h // k[0], k[0], w // k[1], k[1]).max(axis=(3, 5))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    # and the python backend (the reference kernels)
    ref = ember.max_pool2d(ember.tensor(xa, dtype=dtype, device="python"), k)
    np.testing.assert_array_equal(got, np.asarray(ref.tolist(), dtype=dtype).reshape(got.shape))


# ---- cross entropy -------------------------------------------------------------------------------

CE_CASES = [   # (input shape, probs, weight, ignore_index hit, label_smoothing)
    ((8, 5), False, False, False, 0.0),
    ((8, 5), False, True, True, 0.0),
    ((8, 5), False, True, True, 0.1),
    ((6, 4, 3, 2), False, False, True, 0.2),
    ((6, 4, 3), False, True, False, 0.0),
    ((7,), False, False, False, 0.05),
    ((8, 5), True, False, False, 0.0),
    ((5, 3, 4), True, True, False, 0.3),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", CE_CASES, ids=str)
def test_cross_entropy_kernels_match_the_decomposition(case, reduction, dtype):
    shape, probs, weighted, ignore, eps = case
    rng = np.random.default_rng(len(shape) * 100 + int(eps * 10) + probs)
    c = shape[1] if len(shape) > 1 else shape[0]
    x = ember.tensor((rng.standard_normal(shape) * 3).astype(dtype), dtype=dtype, device="numpy")
    if probs:
        p = rng.random(shape)
        t = ember.tensor((p / p.sum(axis=1 if len(shape) > 1 else 0, keepdims=True)).astype(dtype), dtype=dtype,
                         device="numpy")
    else:
        tshape = (shape[:1] + shape[2:]) if len(shape) > 1 else ()
        ta = rng.integers(0, c, tshape)
        if ignore:
            ta.reshape(-1)[::3] = -100
        t = ember.tensor(np.asarray(ta, dtype=np.int64), device="numpy")
    w = ember.tensor(rng.random(c).astype(dtype) + 0.5, dtype=dtype, device="numpy") if weighted else None
    attrs = dict(reduction=reduction, ignore_index=-100, label_smoothing=eps, probs=probs)
    ins = (x, t) if w is None else (x, t, w)
    with ember.no_grad():
        got = apply("cross_entropy", *ins, **attrs)
    want = _decomposed("cross_entropy", *ins, **attrs)
    # (float64: the reference's log_softmax / softmax kernels compute in float32)
    tol = {"float16": 3e-3, "float32": 2e-6, "float64": 1e-6}[dtype]
    assert got.shape == want.shape and got.dtype is want.dtype
    np.testing.assert_allclose(_np(got), _np(want), rtol=tol, atol=tol)
    g = ember.tensor(rng.standard_normal(got.shape).astype(dtype), dtype=dtype, device="numpy")
    with ember.no_grad():
        gk = apply("cross_entropy_backward", g, *ins, **attrs)
    gd = _decomposed("cross_entropy_backward", g, *ins, **attrs)
    assert gk.shape == gd.shape == x.shape
    np.testing.assert_allclose(_np(gk), _np(gd), rtol=tol, atol=tol)


def test_cross_entropy_matches_torch_and_checks_weighted_targets():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    xa = rng.standard_normal((6, 5, 3)).astype(np.float32)
    ta = rng.integers(0, 5, (6, 3))
    ta[0, 0] = -100
    wa = (rng.random(5) + 0.5).astype(np.float32)
    for red in ("mean", "sum", "none"):
        x = ember.tensor(xa, device="numpy").requires_grad_()
        loss = ember.nn.functional.cross_entropy(x, ember.tensor(ta, device="numpy"),
                                                 weight=ember.tensor(wa, device="numpy"), reduction=red,
                                                 label_smoothing=0.1)
        tx = torch.from_numpy(xa).requires_grad_()
        tl = torch.nn.functional.cross_entropy(tx, torch.from_numpy(ta), weight=torch.from_numpy(wa), reduction=red,
                                               label_smoothing=0.1)
        np.testing.assert_allclose(loss.numpy(), tl.detach().numpy(), rtol=1e-5, atol=1e-6)
        up = rng.standard_normal(tl.shape).astype(np.float32)
        loss.backward(ember.tensor(up, device="numpy"))
        tl.backward(torch.from_numpy(up))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    from ember.errors import IndexingError
    with pytest.raises(IndexingError):
        ember.nn.functional.cross_entropy(ember.tensor(xa[:, :, 0], device="numpy"),
                                          ember.tensor(np.array([0, 1, 2, 3, 4, 7]), device="numpy"),
                                          weight=ember.tensor(wa, device="numpy"))


def test_adam_state_with_a_tensor_step_takes_the_reference_ops():
    p = ember.tensor([1.0, -2.0], device="numpy").requires_grad_()
    q = ember.tensor([1.0, -2.0], device="numpy").requires_grad_()
    opts = [optim.Adam([p], lr=0.1), optim.Adam([q], lr=0.1)]
    for o, t in zip(opts, (p, q)):
        t.grad = ember.tensor([0.5, 0.25], device="numpy")
        o.step()
    opts[1].state[q]["step"] = ember.tensor(1.0, device="numpy")     # as a loaded PyTorch state may hold it
    for o, t in zip(opts, (p, q)):
        t.grad = ember.tensor([-0.5, 1.0], device="numpy")
        o.step()
    np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", BN_SHAPES + [(1, 3, 4, 4)], ids=str)
def test_batch_norm_inference_kernel_is_the_formula(shape, dtype):
    """x * scale + shift per channel, bit for bit (materialised channel rows or not)."""
    rng = np.random.default_rng(shape[0] * 3 + shape[1])
    c = shape[1]
    xa = rng.standard_normal(shape).astype(dtype)
    m, v, w, b = (rng.standard_normal(c).astype(dtype) for _ in range(4))
    v = np.abs(v) + np.asarray(0.5, dtype)
    got = ember.batch_norm(*(ember.tensor(a, dtype=dtype, device="numpy") for a in (xa, m, v, w, b)), eps=1e-5)
    f = (lambda a: a.astype(np.float32))
    scale = f(w) / np.sqrt(f(v) + np.float32(1e-5))
    shift = f(b) - f(m) * scale
    bs = (1, c) + (1,) * (len(shape) - 2)
    want = (f(xa) * scale.reshape(bs) + shift.reshape(bs)).astype(dtype)
    np.testing.assert_array_equal(got.numpy(), want)
    want_dec = _decomposed("batch_norm", *(ember.tensor(a, dtype=dtype, device="numpy") for a in (xa, m, v, w, b)),
                           eps=1e-5)
    np.testing.assert_allclose(got.numpy().astype(np.float64), _np(want_dec), rtol=2e-3 if dtype == "float16" else 1e-6,
                               atol=2e-3 if dtype == "float16" else 1e-6)
