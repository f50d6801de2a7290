"""Training against PyTorch goldens (tests/golden/make_train_goldens.py, torch 2.13): optimizer
trajectories over several steps, learning-rate schedules, clip_grad_norm_, BatchNorm2d in
training mode, and two short training runs (MLP + SGD/Nesterov/clipping/StepLR, CNN with
BatchNorm + AdamW) from identical weights and data; plus the nn training behaviour (Dropout,
init, requires_grad of parameters, state dicts)."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import ember
from ember import nn
from ember import optim
from ember.optim import lr_scheduler

HERE = os.path.join(os.path.dirname(__file__), "golden")
_SD, _META = {}, {}


def gold():
    if not _SD:
        _SD.update(ember.load_safetensors(os.path.join(HERE, "train.safetensors"), device="python"))
        with open(os.path.join(HERE, "train.json")) as fh:
            _META.update(json.load(fh))
    return _SD, _META


def arr(key):
    return gold()[0][key].numpy()


def T(key, device, grad=False):
    t = gold()[0][key].to(device)
    return t.detach().requires_grad_() if grad else t


def close(got, want, tol=1e-5, what=""):
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())), err_msg=what)


# ---- optimizers ----------------------------------------------------------------------------------

OPT_NAMES = ["sgd", "sgd_momentum", "sgd_nesterov", "sgd_maximize", "adam", "adam_wd_amsgrad", "adamw",
             "adamw_amsgrad_maximize"]


@pytest.mark.parametrize("name", OPT_NAMES)
def test_optimizer_trajectory_matches_torch(name, device):
    _, meta = gold()
    cls, kw = meta["opt"][name]
    params = [T(f"opt/{name}/p{i}", device, grad=True) for i in range(2)]
    opt = getattr(optim, cls)(params, **kw)
    tol = 1e-4 if device == "webgpu" else 1e-5
    for k in range(meta["opt_steps"]):
        for i, p in enumerate(params):
            p.grad = T(f"opt/{name}/g{k}_{i}", device)
        opt.step()
        for i, p in enumerate(params):
            assert p.device == device and p.requires_grad and p.is_leaf
            close(p, arr(f"opt/{name}/step{k}/p{i}"), tol, f"{name} step {k} param {i} on {device}")


def test_param_groups_and_zero_grad():
    params = [T(f"groups/p{i}", "python", grad=True) for i in range(2)]
    opt = optim.SGD([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.01, "momentum": 0.5}],
                    lr=0.1, momentum=0.9)
    assert opt.param_groups[1]["lr"] == 0.01 and opt.param_groups[0]["momentum"] == 0.9
    for k in range(3):
        for i, p in enumerate(params):
            p.grad = T(f"groups/g{k}_{i}", "python")
        opt.step()
    for i, p in enumerate(params):
        close(p, arr(f"groups/final/p{i}"), 1e-5)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    with pytest.raises(ValueError):
        optim.SGD([{"params": [params[0]]}, {"params": params}], lr=0.1)
    with pytest.raises(ValueError):
        optim.SGD([], lr=0.1)
    with pytest.raises(ValueError):
        optim.SGD(params, lr=0.1, nesterov=True)


def test_optimizer_skips_params_without_grad_and_keeps_identity():
    a = ember.tensor([1.0, 2.0], requires_grad=True)
    b = ember.tensor([3.0], requires_grad=True)
    opt = optim.Adam([a, b], lr=0.1)
    (a * a).sum().backward()
    before = b.tolist()
    opt.step()
    assert b.tolist() == before and a.tolist() != [1.0, 2.0]
    assert a in opt.state and b not in opt.state


@pytest.mark.parametrize("name", ["sgd_momentum", "adam_wd_amsgrad", "adamw"])
def test_optimizer_state_dict_roundtrip(name):
    _, meta = gold()
    cls, kw = meta["opt"][name]
    params = [T(f"opt/{name}/p{i}", "python", grad=True) for i in range(2)]
    opt = getattr(optim, cls)(params, **kw)
    for k in range(3):
        for i, p in enumerate(params):
            p.grad = T(f"opt/{name}/g{k}_{i}", "python")
        opt.step()
    sd = opt.state_dict()
    assert sorted(sd["state"]) == [0, 1] and sd["param_groups"][0]["params"] == [0, 1]
    # a fresh optimizer on copies of the parameters, from the state dict, continues identically
    fresh = [p.detach().requires_grad_() for p in params]
    opt2 = getattr(optim, cls)(fresh, lr=123.0)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"] == kw["lr"]
    for k in range(3, meta["opt_steps"]):
        for i, p in enumerate(fresh):
            p.grad = T(f"opt/{name}/g{k}_{i}", "python")
        opt2.step()
    for i, p in enumerate(fresh):
        close(p, arr(f"opt/{name}/step{meta['opt_steps'] - 1}/p{i}"), 1e-5)


# ---- schedulers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["step", "multistep", "exponential", "linear", "linear_decay", "cosine",
                                  "onecycle_sgd", "onecycle_adam"])
def test_scheduler_matches_torch(name):
    _, meta = gold()
    cls, kw, scls, skw = meta["sched"][name]
    w = ember.zeros((1,), requires_grad=True)
    opt = getattr(optim, cls)([w], **kw)
    sched = getattr(lr_scheduler, scls)(opt, **skw)
    lrs, moms = [], []
    for _ in range(meta["sched_steps"]):
        lrs.append(sched.get_last_lr()[0])
        g = opt.param_groups[0]
        moms.append(g["betas"][0] if "betas" in g else g.get("momentum", 0.0))
        w.grad = ember.ones((1,))
        opt.step()
        sched.step()
    np.testing.assert_allclose(lrs, meta["sched_lrs"][name], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(moms, meta["sched_momenta"][name], rtol=1e-12, atol=1e-15)
    # state_dict round trip: a new scheduler continues where this one is
    sd = sched.state_dict()
    assert "optimizer" not in sd and sd["last_epoch"] == meta["sched_steps"]


def test_onecycle_errors():
    w = ember.zeros((1,), requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    with pytest.raises(ValueError):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1)
    s = lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=2)
    s.step()
    s.step()
    with pytest.raises(ValueError):
        s.step()


# ---- clip_grad_norm_ -----------------------------------------------------------------------------

@pytest.mark.parametrize("tag,norm_type", [("l2", 2.0), ("inf", math.inf), ("l1", 1.0)])
def test_clip_grad_norm_matches_torch(tag, norm_type, device):
    ps = [ember.zeros(s, device=device, requires_grad=True) for s in ((3, 4), (5,))]
    for i, p in enumerate(ps):
        p.grad = T(f"clip/{tag}/g{i}", device)
    total = nn.utils.clip_grad_norm_(ps, 1.5, norm_type=norm_type)
    close(total, arr(f"clip/{tag}/total"), 1e-5)
    for i, p in enumerate(ps):
        close(p.grad, arr(f"clip/{tag}/clipped{i}"), 1e-5)


# ---- BatchNorm2d training mode -------------------------------------------------------------------

@pytest.mark.parametrize("tag,momentum", [("m01", 0.1), ("cma", None)])
def test_batchnorm_training_matches_torch(tag, momentum, device):
    bn = nn.BatchNorm2d(3, momentum=momentum, device=device)
    bn.weight.copy_(T(f"bn/{tag}/weight", device))
    bn.bias.copy_(T(f"bn/{tag}/bias", device))
    tol = 1e-3 if device == "webgpu" else 1e-4
    for k in range(3):
        x = T(f"bn/{tag}/x{k}", device, grad=True)
        bn.weight.grad = bn.bias.grad = None
        y = bn(x)
        y.backward(T(f"bn/{tag}/up{k}", device))
        close(y, arr(f"bn/{tag}/y{k}"), tol, f"y step {k}")
        close(x.grad, arr(f"bn/{tag}/gx{k}"), tol, f"dx step {k}")
        close(bn.weight.grad, arr(f"bn/{tag}/gw{k}"), tol, f"dweight step {k}")
        close(bn.bias.grad, arr(f"bn/{tag}/gb{k}"), tol, f"dbias step {k}")
        close(bn.running_mean, arr(f"bn/{tag}/rm{k}"), tol, f"running_mean step {k}")
        close(bn.running_var, arr(f"bn/{tag}/rv{k}"), tol, f"running_var step {k}")
    assert bn.num_batches_tracked.item() == 3
    bn.eval()
    with ember.no_grad():
        y = bn(T(f"bn/{tag}/x0", device))
    assert not y.requires_grad and bn.num_batches_tracked.item() == 3


# ---- whole training runs -------------------------------------------------------------------------

def _load(model, prefix, device):
    sd, _ = gold()
    model.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    return model.to(device)


def test_mlp_sgd_run_matches_torch(device):
    _, meta = gold()
    mlp = _load(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), "mlp/init/", device)
    opt = optim.SGD(mlp.parameters(), lr=0.2, momentum=0.9, nesterov=True)
    sched = lr_scheduler.StepLR(opt, 2, 0.5)
    X, Y = T("mlp/X", device), T("mlp/Y", device)
    losses = _train(mlp, opt, lambda: nn.functional.cross_entropy(mlp(X), Y, label_smoothing=0.05), 6,
                    clip=1.0, sched=sched)
    _check_run(mlp, losses, meta["mlp_losses"], "mlp", 1e-3 if device == "webgpu" else 1e-5)


def _train(model, opt, loss_fn, steps, clip=None, sched=None):
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        if sched is not None:
            sched.step()
        losses.append(loss.item())
    return losses


def _check_run(model, losses, want_losses, prefix, tol):
    np.testing.assert_allclose(losses, want_losses, rtol=tol)
    for k, v in model.state_dict().items():
        close(v, arr(f"{prefix}/final/{k}"), tol * 10, k)


def test_cnn_adamw_run_matches_torch(device):
    _, meta = gold()
    # (no bias before BatchNorm: its gradient is zero up to rounding, which Adam would amplify)
    cnn = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(4, 6, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(24, 5))
    _load(cnn, "cnn/init/", device)
    opt = optim.AdamW(cnn.parameters(), lr=1e-2, weight_decay=0.05)
    X, Y = T("cnn/X", device), T("cnn/Y", device)
    losses = _train(cnn, opt, lambda: nn.functional.cross_entropy(cnn(X), Y), 5)
    _check_run(cnn, losses, meta["cnn_losses"], "cnn", 1e-3 if device == "webgpu" else 1e-4)


# ---- nn for training -----------------------------------------------------------------------------

def test_parameters_require_grad_and_modes():
    m = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2), nn.LayerNorm(2), nn.Embedding(4, 2))
    assert all(p.requires_grad for p in m.parameters())
    assert not any(b.requires_grad for b in m.buffers())
    m.eval()
    assert all(p.requires_grad for p in m.parameters())       # eval() does not change it (PyTorch)
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    m.requires_grad_()
    w = m[0].weight
    m.load_state_dict(m.state_dict())                       # assign=False: same objects, still trainable
    assert m[0].weight is w and w.requires_grad
    m.load_state_dict({k: v.detach() for k, v in m.state_dict().items()}, assign=True)
    assert not m[0].weight.requires_grad                    # assign=True keeps the loaded tensors as they are
    m2 = nn.Linear(2, 2).to("numpy")
    assert m2.weight.device == "numpy" and m2.weight.requires_grad and m2.weight.is_leaf
    p = nn.Parameter(ember.ones((2,)))
    assert p.requires_grad and not nn.Parameter(ember.ones((2,)), requires_grad=False).requires_grad


def test_inference_under_no_grad_records_nothing():
    m = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    with ember.no_grad():
        y = m(ember.ones((2, 3)))
    assert not y.requires_grad and y.grad_fn is None
    assert m(ember.ones((2, 3))).requires_grad


def test_dropout_train_mode():
    ember.manual_seed(3)
    d = nn.Dropout(0.25)
    x = ember.ones((200, 50), requires_grad=True)
    y = d(x)
    v = y.numpy()
    assert np.isin(v, np.array([0.0, 1 / 0.75], dtype=np.float32)).all()
    assert abs((v == 0).mean() - 0.25) < 0.02
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), v)             # the gradient is the same mask and scale
    ember.manual_seed(3)
    assert (nn.Dropout(0.25)(ember.ones((200, 50))).numpy() == v).all()   # seeded
    assert d.eval()(x) is x
    assert (nn.Dropout(1.0)(x).numpy() == 0).all()


def test_default_init_matches_pytorch_distributions():
    ember.manual_seed(0)
    lin = nn.Linear(400, 300)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / math.sqrt(400)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.98 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound and np.abs(b).max() <= bound
    conv = nn.Conv2d(8, 16, 3, groups=2)
    assert np.abs(conv.weight.numpy()).max() <= 1 / math.sqrt(4 * 9)
    emb = nn.Embedding(1000, 64, padding_idx=3).weight.numpy()
    assert abs(emb.mean()) < 0.02 and abs(emb.std() - 1.0) < 0.02 and (emb[3] == 0).all()
    ln = nn.LayerNorm(5)
    assert ln.weight.tolist() == [1.0] * 5 and ln.bias.tolist() == [0.0] * 5
    t = ember.zeros((256, 128))
    nn.init.xavier_uniform_(t)
    assert np.abs(t.numpy()).max() <= math.sqrt(6 / 384)
    nn.init.kaiming_normal_(t, nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 128)) < 0.01
    nn.init.trunc_normal_(t, std=0.5, a=-1.0, b=1.0)
    v = t.numpy()
    assert v.min() >= -1.0 and v.max() <= 1.0 and abs(v.std() - 0.44) < 0.03
    nn.init.constant_(t, 0.5)
    assert (t.numpy() == 0.5).all()
    assert nn.init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(1 / 3))


def test_loss_modules():
    x = ember.tensor([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]])
    t = ember.tensor([1, 2])
    assert nn.CrossEntropyLoss()(x, t).item() == pytest.approx(ember.cross_entropy(x, t).item())
    assert nn.CrossEntropyLoss(reduction="none", label_smoothing=0.1)(x, t).shape == (2,)
    assert nn.NLLLoss()(x.log_softmax(), t).item() == pytest.approx(ember.cross_entropy(x, t).item(), rel=1e-6)
    assert nn.MSELoss(reduction="sum")(x, x * 0.0).item() == pytest.approx(float((x.numpy() ** 2).sum()), rel=1e-6)
    assert nn.L1Loss()(x, x).item() == 0.0
    assert nn.BCEWithLogitsLoss(pos_weight=ember.tensor([1.0, 2.0, 1.0]))(x, x * 0.0 + 1.0).item() > 0
    with pytest.raises(ValueError):
        nn.functional.mse_loss(x, x, reduction="avg")


def test_docstring_examples_run():
    import doctest
    import importlib

    for name in ("ember.autograd", "ember.random", "ember.optim", "ember.optim.optimizer",
                 "ember.optim.lr_scheduler", "ember.nn.init", "ember.nn.functional", "ember.nn.loss",
                 "ember.nn.utils", "ember.ops.losses"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0 and result.attempted > 0, name


@pytest.mark.parametrize("name", ["sequential", "warm_restarts", "warm_restarts_mult", "plateau"])
def test_composed_and_metric_schedulers_match_torch(name):
    _, meta = gold()
    w = ember.zeros((1,), requires_grad=True)
    opt = optim.SGD([w], lr=0.5)
    S = lr_scheduler
    if name == "sequential":
        sched = S.SequentialLR(opt, [S.LinearLR(opt, start_factor=0.1, total_iters=4),
                                     S.CosineAnnealingLR(opt, T_max=10, eta_min=0.01),
                                     S.ExponentialLR(opt, gamma=0.8)], milestones=[4, 14])
    elif name == "warm_restarts":
        sched = S.CosineAnnealingWarmRestarts(opt, T_0=5, eta_min=0.001)
    elif name == "warm_restarts_mult":
        sched = S.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2, eta_min=0.001)
    else:
        sched = S.ReduceLROnPlateau(opt, factor=0.5, patience=2, cooldown=1, threshold=0.01, min_lr=0.05)
    lrs = []
    for k in range(meta["sched_steps"]):
        lrs.append(opt.param_groups[0]["lr"])
        w.grad = ember.ones((1,))
        opt.step()
        sched.step(meta["plateau_metrics"][k]) if name == "plateau" else sched.step()
    np.testing.assert_allclose(lrs, meta["sched2_lrs"][name], rtol=1e-12, atol=1e-15)
    state = sched.state_dict()
    assert "optimizer" not in state


# ---- WebGPU: one fused kernel per parameter per step ----------------------------------------------

def _webgpu_or_skip():
    try:
        ember.get_backend("webgpu")
    except ember.errors.DeviceError as e:
        pytest.skip(f"webgpu backend unavailable on this machine: {e}")
    import importlib
    return importlib.import_module("ember.webgpu")


@pytest.mark.parametrize("name", OPT_NAMES)
def test_webgpu_step_is_one_dispatch_per_parameter(name):
    """Issue 10: an optimizer step on WebGPU is one kernel per parameter (parameter, gradient and
    state in one dispatch), and it gives the same values as the reference ops on the same GPU."""
    wg = _webgpu_or_skip()
    from ember.optim import optimizer as _opt
    _, meta = gold()
    cls, kw = meta["opt"][name]
    runs = {}
    for fused in (True, False):
        params = [T(f"opt/{name}/p{i}", "webgpu", grad=True) for i in range(2)]
        opt = getattr(optim, cls)(params, **kw)
        old = _opt._FUSED[0]
        _opt._FUSED[0] = fused
        try:
            for k in range(meta["opt_steps"]):
                grads = [T(f"opt/{name}/g{k}_{i}", "webgpu") for i in range(2)]
                wg.evaluate(*grads)
                for p, g in zip(params, grads):
                    p.grad = g
                wg.reset_stats()
                opt.step()
                if fused:
                    assert wg.stats()["dispatches"] == len(params), f"{name} step {k}: {wg.stats()['dispatches']}"
        finally:
            _opt._FUSED[0] = old
        runs[fused] = [p.numpy() for p in params]
    for a, b in zip(runs[True], runs[False]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_webgpu_fused_step_keeps_shared_buffers_and_foreign_state():
    """The new parameter goes into a new buffer (a tensor sharing the old one keeps its values),
    and state the optimizer did not allocate (loaded from another optimizer) is copied before
    it is updated in place: the other optimizer's state does not move."""
    _webgpu_or_skip()
    p = ember.tensor([1.0, 2.0, 3.0], device="webgpu").requires_grad_()
    before = p.detach()
    opt = optim.Adam([p], lr=0.1)
    p.grad = ember.tensor([1.0, 1.0, 1.0], device="webgpu")
    opt.step()
    assert before.tolist() == [1.0, 2.0, 3.0] and p.tolist() != [1.0, 2.0, 3.0]
    q = ember.tensor(p.numpy(), device="webgpu").requires_grad_()
    opt2 = optim.Adam([q], lr=0.1)
    opt2.load_state_dict(opt.state_dict())
    m1 = opt.state[p]["exp_avg"].tolist()
    for _ in range(2):
        q.grad = ember.tensor([0.5, 0.5, 0.5], device="webgpu")
        opt2.step()
    assert opt.state[p]["exp_avg"].tolist() == m1
    # and opt2 followed the same rule as the python reference
    pr = ember.tensor(p.numpy()).requires_grad_()
    opt3 = optim.Adam([pr], lr=0.1)
    opt3.load_state_dict({"state": {0: {k: (v.to("python") if hasattr(v, "to") else v)
                                        for k, v in opt.state[p].items()}},
                          "param_groups": opt.state_dict()["param_groups"]})
    for _ in range(2):
        pr.grad = ember.tensor([0.5, 0.5, 0.5])
        opt3.step()
    close(q, pr.numpy(), 1e-6)
