"""Compiled training steps (ember.compile over forward + backward + optimizer step): on every
backend the replayed steps give bit-for-bit the eager trajectory (losses, parameters, BatchNorm
statistics, gradients, learning rates), and what a plan cannot replay runs eagerly instead."""
from __future__ import annotations

import numpy as np
import pytest

import ember
import ember.nn.functional as F
from ember import nn


class Net(nn.Module):
    """Conv + BatchNorm (running statistics updated in place) + Linear + LayerNorm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 6)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        x = F.max_pool2d(ember.relu(self.bn(self.conv(x))), 2)
        return self.ln(self.fc(x.reshape(x.shape[0], -1)))


def _setup(device, opt_name="adamw"):
    ember.manual_seed(0)
    model = Net().to(device).train()
    rng = np.random.default_rng(0)
    x = ember.tensor(rng.standard_normal((3, 1, 8, 8)).astype(np.float32), device=device)
    y = ember.tensor(rng.integers(0, 6, 3), device=device)
    if opt_name == "adamw":
        opt = ember.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    else:
        opt = ember.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = ember.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched, x, y


def _state(model, opt):
    sd = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    return sd, grads, [g["lr"] for g in opt.param_groups]


def _trajectory(device, compiled, opt_name="adamw", steps=5):
    model, opt, sched, x, y = _setup(device, opt_name)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()
        return loss

    f = ember.compile(step) if compiled else step
    losses = [f(x, y).item() for _ in range(steps)]
    return losses, _state(model, opt), (f.stats() if compiled else None)


@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_compiled_training_steps_follow_the_eager_trajectory_exactly(device, opt_name):
    want, (sd0, g0, lr0), _ = _trajectory(device, False, opt_name)
    got, (sd1, g1, lr1), st = _trajectory(device, True, opt_name)
    # BatchNorm's running statistics are updated in place: the first capture finds that and
    # captures once more with them as variables; every later call replays.
    assert st["replays"] == 3 and st["captures"] == 2 and st["eager_calls"] == 0, st
    assert got == want
    assert want[-1] < want[0]
    assert lr1 == lr0 == [0.05 * 0.25] if opt_name == "adamw" else lr1 == lr0
    assert sd1.keys() == sd0.keys() and g1.keys() == g0.keys()
    for k in sd0:      # weights, biases, running_mean/var, num_batches_tracked
        np.testing.assert_array_equal(sd1[k], sd0[k], err_msg=k)
    assert int(sd1["bn.num_batches_tracked"]) == 5
    for k in g0:
        np.testing.assert_array_equal(g1[k], g0[k], err_msg=k)


def test_the_replay_runs_no_python_model_code_and_records_host_steps():
    model, opt, sched, x, y = _setup("numpy")
    calls = []
    fwd = model.forward

    def counted(inp):
        calls.append(1)
        return fwd(inp)
    model.forward = counted

    @ember.compile
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    for _ in range(4):
        step(x, y)
    assert len(calls) == 2                      # two captures, then replays
    plan = step.plan_for(x, y)
    text = repr(plan)
    assert "host steps" in text and "zero_grad" in text and "accumulate_grad" in text and "set_" in text
    assert "conv2d" in plan.kernels() and len(plan) == sum(plan.kernels().values())


def test_gradient_accumulation_across_compiled_calls(device):
    """No zero_grad inside: each call adds its gradients to the ones already there, as eager."""
    out = []
    for compiled in (False, True):
        ember.manual_seed(1)
        lin = nn.Linear(4, 3).to(device)
        x = ember.tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8, device=device)

        def fb(x):
            loss = (lin(x) ** 2).mean()
            loss.backward()
            return loss

        f = ember.compile(fb) if compiled else fb
        for _ in range(3):
            f(x)
        out.append((lin.weight.grad.numpy(), lin.bias.grad.numpy()))
        if compiled:
            assert f.stats()["replays"] == 2
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-6, atol=1e-7)
    # three identical calls: three times one call's gradient
    ember.manual_seed(1)
    lin = nn.Linear(4, 3)
    x = ember.tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    (lin(x) ** 2).mean().backward()
    np.testing.assert_allclose(out[1][0], 3 * lin.weight.grad.numpy(), rtol=1e-5)


def test_a_forward_whose_caller_runs_backward_stays_eager():
    lin = nn.Linear(3, 2)
    f = ember.compile(lin)
    x = ember.ones((1, 3))
    for _ in range(3):
        y = f(x)
        assert y.requires_grad
        y.sum().backward()
    st = f.stats()
    assert st["plans"] == 0 and st["eager_calls"] == 2
    assert "autograd graph" in next(iter(st["eager"].values()))
    np.testing.assert_allclose(lin.bias.grad.numpy(), [3.0, 3.0])


def test_what_a_plan_cannot_replay_runs_eagerly():
    lin = nn.Linear(3, 2)
    opt = ember.optim.SGD(lin.parameters(), lr=0.1)
    x = ember.ones((2, 3))

    @ember.compile
    def logs_inside(x):           # reads the loss while capturing: data-dependent
        opt.zero_grad()
        loss = lin(x).sum()
        loss.backward()
        opt.step()
        return loss.item()

    @ember.compile
    def with_closure(x):
        def closure():
            opt.zero_grad()
            loss = lin(x).sum()
            loss.backward()
            return loss
        return opt.step(closure)

    for f, why in ((logs_inside, "read while capturing"), (with_closure, "closure")):
        a = f(x)
        b = f(x)
        assert float(b) < float(a)          # eager calls still train
        st = f.stats()
        assert st["plans"] == 0 and why in next(iter(st["eager"].values())), st


def test_dropout_in_a_compiled_training_step_draws_new_masks_as_eager(device):
    runs = []
    for compiled in (False, True):
        ember.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1)).to(device).train()
        opt = ember.optim.SGD(model.parameters(), lr=0.01)
        x = ember.ones((16, 4), device=device)

        def step(x):
            opt.zero_grad()
            loss = model(x).sum()
            loss.backward()
            opt.step()
            return loss
        f = ember.compile(step) if compiled else step
        runs.append([f(x).item() for _ in range(4)])
        if compiled:
            assert f.stats()["replays"] == 3, f.stats()
    assert runs[1] == runs[0]
    assert len(set(runs[0])) == 4          # a new mask every step, not a frozen one


def test_learner_compile_gives_the_eager_run():
    from ember.train import DataLoader, Learner, TensorDataset

    runs = []
    for compiled in (False, True):
        ember.manual_seed(0)
        x = ember.randn(40, 3)
        y = (x[:, 0] > 0).astype("int64")
        model = nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
        opt = ember.optim.Adam(model.parameters(), lr=0.05)
        sched = ember.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=3 * 4)
        learner = Learner(model, opt, scheduler=sched, scheduler_step="batch", grad_clip=1.0,
                          dashboard=None, compile=compiled)
        # 40 samples in batches of 12: three full batches and a last one of 4 (a second plan)
        learner.fit(DataLoader(TensorDataset(x, y), batch_size=12, shuffle=True, seed=1), epochs=3)
        runs.append((learner.history, {k: v.numpy() for k, v in model.state_dict().items()}))
        if compiled:
            st = learner._train_step.stats()
            assert st["replays"] >= 6 and st["eager_calls"] == 0, st
    (h0, s0), (h1, s1) = runs
    assert h1["loss"] == h0["loss"] and h1["accuracy"] == h0["accuracy"] and h1["lr"] == h0["lr"]
    for k in s0:
        np.testing.assert_array_equal(s1[k], s0[k], err_msg=k)
