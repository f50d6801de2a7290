"""Produce tests/golden/train.safetensors and train.json once, with PyTorch (torch 2.13 CPU):
optimizer trajectories from identical parameters and gradients, learning-rate schedules,
clip_grad_norm_, BatchNorm2d in training mode, and two short training runs (an MLP with SGD,
a small CNN with BatchNorm and AdamW) from identical weights and data. torch is a golden-time
tool only; tests/test_optim.py reads the committed files.

    .venv/bin/python tests/golden/make_train_goldens.py

Tensors (float32/int64): ``opt/<config>/p<i>`` initial parameters, ``opt/<config>/g<k>_<i>`` the
gradient of parameter i at step k, ``opt/<config>/step<k>/p<i>`` the parameters after step k;
``clip/...``, ``bn/...``, ``mlp/...``, ``cnn/...`` as written below. JSON: the configurations,
the schedules' learning rates (and momenta), the runs' losses.
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "train.safetensors")
OUT_JSON = os.path.join(HERE, "train.json")

OPT_CONFIGS = {
    "sgd": ("SGD", {"lr": 0.1}),
    "sgd_momentum": ("SGD", {"lr": 0.1, "momentum": 0.9, "dampening": 0.1, "weight_decay": 0.01}),
    "sgd_nesterov": ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-3}),
    "sgd_maximize": ("SGD", {"lr": 0.1, "momentum": 0.5, "maximize": True}),
    "adam": ("Adam", {"lr": 1e-2}),
    "adam_wd_amsgrad": ("Adam", {"lr": 5e-3, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1,
                                 "amsgrad": True}),
    "adamw": ("AdamW", {"lr": 1e-2, "weight_decay": 0.1}),
    "adamw_amsgrad_maximize": ("AdamW", {"lr": 1e-2, "amsgrad": True, "maximize": True}),
}
STEPS = 6

SCHEDULES = {
    "step": ("SGD", {"lr": 0.5}, "StepLR", {"step_size": 3, "gamma": 0.5}),
    "multistep": ("SGD", {"lr": 0.5}, "MultiStepLR", {"milestones": [2, 5, 5], "gamma": 0.1}),
    "exponential": ("SGD", {"lr": 0.5}, "ExponentialLR", {"gamma": 0.9}),
    "linear": ("SGD", {"lr": 0.5}, "LinearLR", {"start_factor": 0.25, "total_iters": 8}),
    "linear_decay": ("SGD", {"lr": 0.5}, "LinearLR", {"start_factor": 1.0, "end_factor": 0.1, "total_iters": 10}),
    "cosine": ("SGD", {"lr": 0.5}, "CosineAnnealingLR", {"T_max": 10, "eta_min": 0.01}),
    "onecycle_sgd": ("SGD", {"lr": 0.5, "momentum": 0.9}, "OneCycleLR", {"max_lr": 0.1, "total_steps": 25}),
    "onecycle_adam": ("Adam", {"lr": 0.5}, "OneCycleLR",
                      {"max_lr": 0.02, "epochs": 5, "steps_per_epoch": 5, "anneal_strategy": "linear",
                       "three_phase": True, "pct_start": 0.25}),
}
SCHED_STEPS = 24


def ember_tensors(d):
    import sys
    sys.path.insert(0, os.path.dirname(HERE))
    import ember
    return ember, {k: ember.tensor(v) for k, v in d.items()}


def main():
    rng = np.random.default_rng(7)
    out, meta = {}, {"opt": OPT_CONFIGS, "opt_steps": STEPS, "sched": SCHEDULES, "sched_steps": SCHED_STEPS}

    # ---- optimizers: fixed gradients, so only the update rule is compared ----
    shapes = [(3, 4), (5,)]
    for name, (cls, kw) in OPT_CONFIGS.items():
        p0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(STEPS)]
        params = [torch.tensor(p, requires_grad=True) for p in p0]
        opt = getattr(torch.optim, cls)(params, **{k: tuple(v) if k == "betas" else v for k, v in kw.items()})
        for i, p in enumerate(p0):
            out[f"opt/{name}/p{i}"] = p
        for k in range(STEPS):
            for i, (p, g) in enumerate(zip(params, grads[k])):
                p.grad = torch.tensor(g)
                out[f"opt/{name}/g{k}_{i}"] = g
            opt.step()
            for i, p in enumerate(params):
                out[f"opt/{name}/step{k}/p{i}"] = p.detach().numpy().copy()

    # two param groups with their own lr / momentum
    p0 = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [torch.tensor(p, requires_grad=True) for p in p0]
    opt = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.01, "momentum": 0.5}],
                          lr=0.1, momentum=0.9)
    for i, p in enumerate(p0):
        out[f"groups/p{i}"] = p
    for k in range(3):
        for i, p in enumerate(params):
            g = rng.standard_normal(shapes[i]).astype(np.float32)
            p.grad = torch.tensor(g)
            out[f"groups/g{k}_{i}"] = g
        opt.step()
    for i, p in enumerate(params):
        out[f"groups/final/p{i}"] = p.detach().numpy().copy()

    # ---- schedules ----
    meta["sched_lrs"], meta["sched_momenta"] = {}, {}
    for name, (cls, kw, scls, skw) in SCHEDULES.items():
        w = torch.zeros(1, requires_grad=True)
        opt = getattr(torch.optim, cls)([w], **kw)
        sched = getattr(torch.optim.lr_scheduler, scls)(opt, **skw)
        lrs, moms = [], []
        for _ in range(SCHED_STEPS):
            lrs.append(sched.get_last_lr()[0])
            g = opt.param_groups[0]
            moms.append(g["betas"][0] if "betas" in g else g.get("momentum", 0.0))
            w.grad = torch.ones(1)
            opt.step()
            sched.step()
        meta["sched_lrs"][name] = lrs
        meta["sched_momenta"][name] = moms

    # ---- clip_grad_norm_ ----
    for norm_type, tag in ((2.0, "l2"), (float("inf"), "inf"), (1.0, "l1")):
        gs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        ps = [torch.zeros(s, requires_grad=True) for s in shapes]
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g)
        total = torch.nn.utils.clip_grad_norm_(ps, 1.5, norm_type=norm_type)
        for i, (g, p) in enumerate(zip(gs, ps)):
            out[f"clip/{tag}/g{i}"] = g
            out[f"clip/{tag}/clipped{i}"] = p.grad.numpy().copy()
        out[f"clip/{tag}/total"] = np.array(total.item(), dtype=np.float32)

    # ---- BatchNorm2d in training mode ----
    for mom, tag in ((0.1, "m01"), (None, "cma")):
        torch.manual_seed(0)
        bn = torch.nn.BatchNorm2d(3, momentum=mom)
        with torch.no_grad():
            bn.weight.copy_(torch.tensor(rng.uniform(0.5, 1.5, 3).astype(np.float32)))
            bn.bias.copy_(torch.tensor(rng.standard_normal(3).astype(np.float32)))
        out[f"bn/{tag}/weight"] = bn.weight.detach().numpy().copy()
        out[f"bn/{tag}/bias"] = bn.bias.detach().numpy().copy()
        for k in range(3):
            x = (rng.standard_normal((4, 3, 5, 5)) * 2 + 1).astype(np.float32)
            xt = torch.tensor(x, requires_grad=True)
            y = bn(xt)
            up = rng.standard_normal(y.shape).astype(np.float32)
            bn.weight.grad = None
            bn.bias.grad = None
            y.backward(torch.tensor(up))
            out[f"bn/{tag}/x{k}"], out[f"bn/{tag}/up{k}"] = x, up
            out[f"bn/{tag}/y{k}"] = y.detach().numpy()
            out[f"bn/{tag}/gx{k}"] = xt.grad.numpy()
            out[f"bn/{tag}/gw{k}"] = bn.weight.grad.numpy().copy()
            out[f"bn/{tag}/gb{k}"] = bn.bias.grad.numpy().copy()
            out[f"bn/{tag}/rm{k}"] = bn.running_mean.numpy().copy()
            out[f"bn/{tag}/rv{k}"] = bn.running_var.numpy().copy()

    # ---- an MLP: SGD with momentum, label smoothing, clipping, StepLR ----
    torch.manual_seed(1)
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    for k, v in mlp.state_dict().items():
        out[f"mlp/init/{k}"] = v.numpy().copy()
    X = rng.standard_normal((16, 6)).astype(np.float32)
    Y = rng.integers(0, 3, 16).astype(np.int64)
    out["mlp/X"], out["mlp/Y"] = X, Y
    opt = torch.optim.SGD(mlp.parameters(), lr=0.2, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = F.cross_entropy(mlp(torch.tensor(X)), torch.tensor(Y), label_smoothing=0.05)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mlp.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    meta["mlp_losses"] = losses
    for k, v in mlp.state_dict().items():
        out[f"mlp/final/{k}"] = v.numpy().copy()

    # ---- a small CNN with BatchNorm: AdamW ----
    torch.manual_seed(2)
    cnn = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                              torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 6, 3, stride=2), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Linear(24, 5))
    for k, v in cnn.state_dict().items():
        out[f"cnn/init/{k}"] = v.numpy().copy()
    X = rng.standard_normal((8, 1, 10, 10)).astype(np.float32)
    Y = rng.integers(0, 5, 8).astype(np.int64)
    out["cnn/X"], out["cnn/Y"] = X, Y
    opt = torch.optim.AdamW(cnn.parameters(), lr=1e-2, weight_decay=0.05)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        loss = F.cross_entropy(cnn(torch.tensor(X)), torch.tensor(Y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    meta["cnn_losses"] = losses
    for k, v in cnn.state_dict().items():
        out[f"cnn/final/{k}"] = v.numpy().copy()

    # ---- schedulers that need more than (optimizer, kwargs) ----
    meta["sched2_lrs"] = {}
    plateau_metrics = [1.0, 0.9, 0.85, 0.849, 0.85, 0.851, 0.7, 0.7, 0.7, 0.7, 0.69, 0.7, 0.7, 0.7, 0.5, 0.5,
                       0.5, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4]
    meta["plateau_metrics"] = plateau_metrics
    for name in ("sequential", "warm_restarts", "warm_restarts_mult", "plateau"):
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.5)
        S = torch.optim.lr_scheduler
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
        for k in range(SCHED_STEPS):
            lrs.append(opt.param_groups[0]["lr"])
            w.grad = torch.ones(1)
            opt.step()
            sched.step(plateau_metrics[k]) if name == "plateau" else sched.step()
        meta["sched2_lrs"][name] = lrs

    ember, tensors = ember_tensors(out)
    ember.save_safetensors(tensors, OUT)
    with open(OUT_JSON, "w") as fh:
        json.dump(meta, fh, indent=1)
    print(f"wrote {len(out)} tensors to {OUT} and {OUT_JSON}")


if __name__ == "__main__":
    main()
