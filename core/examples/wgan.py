"""``python -m ember.examples wgan``: a Wasserstein GAN with gradient penalty (Gulrajani et al.,
2017) learns to draw MNIST digits; writes a PNG grid of samples (``wgan.png``).

Generator: z (64) -> 256 -> 256 -> 784, ReLU, tanh. Critic: 784 -> 256 -> 256 -> 1, leaky ReLU.
Each generator step follows ``--critic-steps`` (5) critic steps on
``D(fake) - D(real) + 10 * (|grad_x D(x_hat)| - 1)^2`` at random interpolates ``x_hat``, Adam
(1e-4, betas 0.5, 0.9) for both.

The penalty needs the critic's gradient with respect to its input *inside* the loss, which is then
differentiated with respect to the critic's weights: a second-order gradient. ember's autograd is
first order (``create_graph`` is not supported), so ``Critic.forward_with_input_grad`` writes the
input gradient out as ordinary ops (the backward of three linear layers and two leaky ReLUs:
matmuls with the transposed weights and the activations' slopes) and autodiff differentiates
that. The slopes are piecewise constant, so this is exactly what double backward would compute;
the test checks the input gradient against ``ember.autograd.grad``.

Data: ``demos/train/data/`` (6,000 MNIST training images) or ``--data DIR``. ``--quick`` runs a
few steps on 256 images (a smoke test).
"""
from __future__ import annotations

import argparse
import time

import ember
from ember import nn
from ember.nn import functional as F

from .png import encode_png, image_grid

Z, HIDDEN, SLOPE = 64, 256, 0.2


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(Z, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                                 nn.Linear(HIDDEN, 784), nn.Tanh())

    def forward(self, z):
        return self.net(z)                                      # (N, 784) in [-1, 1]


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(784, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, 1)

    def forward(self, x):
        return self.l3(F.leaky_relu(self.l2(F.leaky_relu(self.l1(x), SLOPE)), SLOPE))   # (N, 1)

    def forward_with_input_grad(self, x):
        """``(D(x), dD/dx)``: the input gradient as ops that autodiff can differentiate again."""
        a1 = self.l1(x)                                         # (N, H)
        a2 = self.l2(F.leaky_relu(a1, SLOPE))                   # (N, H)
        d = self.l3(F.leaky_relu(a2, SLOPE))                    # (N, 1)
        s1 = (a1.detach() > 0).astype("float32") * (1 - SLOPE) + SLOPE   # leaky ReLU's slope, (N, H)
        s2 = (a2.detach() > 0).astype("float32") * (1 - SLOPE) + SLOPE
        g2 = self.l3.weight * s2                                # dD/da2: (1, H) * (N, H)
        g1 = (g2 @ self.l2.weight) * s1                         # dD/da1: (N, H)
        return d, g1 @ self.l1.weight                           # dD/dx: (N, 784)


def load_images(data: str | None, limit: int | None, device: str):
    """MNIST training images as (N, 784) float32 in [-1, 1] on ``device``."""
    from .mnist import default_data, demo_module

    x, _ = demo_module().load_split(data or default_data(), "train", limit)
    return (x.astype("float32") / 127.5 - 1.0).reshape((x.shape[0], 784)).to(device)


def samples_png(gen, path: str, z) -> tuple:
    """Write ``gen(z)`` (8 x 8 digits) as a PNG grid; returns (width, height)."""
    with ember.no_grad():
        imgs = ((gen.eval()(z) + 1.0) * 127.5).clip(0, 255).tolist()
    gen.train()
    pix, w, h = image_grid(imgs, 8, 8)
    with open(path, "wb") as f:
        f.write(encode_png(pix, w, h))
    return w, h


def run(*, steps: int = 2000, critic_steps: int = 5, batch: int = 64, gp: float = 10.0, lr: float = 1e-4,
        limit: int | None = None, data: str | None = None, device: str | None = None, seed: int = 0,
        out: str = "wgan.png", log_every: int = 100, log=print) -> dict:
    """Train for ``steps`` generator steps; return {history: {wdist, gp, g_loss}, png: (w, h), path}."""
    device = device or ("numpy" if "numpy" in ember.devices() else "python")
    ember.manual_seed(seed)
    real = load_images(data, limit, device)
    n = real.shape[0]
    gen, critic = Generator().to(device), Critic().to(device)
    opt_g = ember.optim.Adam(gen.parameters(), lr=lr, betas=(0.5, 0.9))
    opt_d = ember.optim.Adam(critic.parameters(), lr=lr, betas=(0.5, 0.9))
    fixed_z = ember.randn(64, Z, device=device)
    hist = {"wdist": [], "gp": [], "g_loss": []}
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(critic_steps):
            idx = ember.randint(0, n, (batch,), device=device)
            xr = ember.take(real, idx, axis=0)
            with ember.no_grad():
                xf = gen(ember.randn(batch, Z, device=device))
            eps = ember.rand(batch, 1, device=device)
            xh = xr * eps + xf * (1.0 - eps)
            _, gx = critic.forward_with_input_grad(xh)
            norm = ember.sqrt((gx * gx).sum(axis=1) + 1e-12)
            penalty = ((norm - 1.0) ** 2).mean()
            wdist = critic(xr).mean() - critic(xf).mean()
            loss_d = -wdist + penalty * gp
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
        loss_g = -critic(gen(ember.randn(batch, Z, device=device))).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        hist["wdist"].append(float(wdist.item()))
        hist["gp"].append(float(penalty.item()))
        hist["g_loss"].append(float(loss_g.item()))
        if log and ((step + 1) % log_every == 0 or step + 1 == steps):
            log(f"step {step + 1}/{steps}  W-distance estimate {hist['wdist'][-1]:.4f}  penalty "
                f"{hist['gp'][-1]:.4f}  G loss {hist['g_loss'][-1]:.4f}  [{time.perf_counter() - t0:.0f} s]")
    size = samples_png(gen, out, fixed_z)
    return {"history": hist, "png": size, "path": out, "gen": gen, "critic": critic}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.examples wgan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="generator steps")
    ap.add_argument("--critic-steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="20 steps on 256 images")
    ap.add_argument("--data", default=None, help="folder with MNIST IDX .gz files (default: demos/train/data)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="wgan.png")
    a = ap.parse_args(argv)
    kw = dict(steps=20, limit=256, log_every=5) if a.quick else dict(steps=a.steps)
    r = run(critic_steps=a.critic_steps, data=a.data, device=a.device, seed=a.seed, out=a.out, **kw)
    print(f"wrote {r['path']} ({r['png'][0]}x{r['png'][1]}, 64 samples)")
    return 0
