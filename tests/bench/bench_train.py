"""One training step (forward + backward + Adam) of the MNIST demo CNN at batch 64 and of a
MiniLM-sized encoder layer (384 wide, 12 heads, 1536 inner, batch 8 x 128 tokens), ember against
PyTorch CPU in the same run, as ratios.

    .venv/bin/python tests/bench/bench_train.py [--quick] [--devices numpy,webgpu] [--threads N]
                                                [--torch-device cuda] [--cases cnn,encoder]
                                                [--modes eager,compiled]
    .venv/bin/python tests/bench/bench_train.py --host --devices webgpu --modes compiled [--steps N]

Each ember step runs in two modes: ``eager`` (the step's Python runs every time) and
``compiled`` (the same step function under ``ember.compile``: forward, backward and the
optimizer's host step replayed from a plan). PyTorch runs eagerly.

``--torch-device cuda`` puts the PyTorch side on the GPU (fp32, TF32 off), the peer of ember's
webgpu backend on a GPU machine.

The ember and PyTorch steps alternate (so a busy machine slows both alike) and the best and
median of each are reported; ratio > 1 means ember is slower. BLAS and PyTorch use one thread
unless ``--threads`` says otherwise. Losses of both are printed so that a broken step shows.

``--host`` (no PyTorch needed) measures what the *host* does per webgpu step, the part a real GPU
cannot hide: the time until the step's last submit returns, less the time spent inside
``queue.submit``/``write_buffer`` (lavapipe runs the kernels on the CPU in there; a real GPU
returns at once), with the loss read only after the clock stops, and per step the dispatches, dispatches encoded from
Python one by one (``rt.dispatch``), prebuilt stream segments submitted, buffers and bind groups
created, and the plan's replay form (``Plan.fast.describe()``). ``--profile`` adds cProfile's
top functions of the measured steps.

``--kernels`` (webgpu, no PyTorch needed) lists every dispatch of one compiled step with its
op, grid and shapes and, on an adapter with ``timestamp-query``, its GPU time, then a table per
kernel and op with the total and share; dispatches with a handful of workgroups for a large
input are marked ``<<`` (``tests/bench/webgpu_kernels.py``). ``--no-list`` prints the table only.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(THREADS)

import numpy as np  # noqa: E402

import ember  # noqa: E402
import ember.nn.functional as F  # noqa: E402
from ember import nn  # noqa: E402

QUICK = "--quick" in sys.argv
DEVICES = sys.argv[sys.argv.index("--devices") + 1].split(",") if "--devices" in sys.argv else ["numpy"]
ROUNDS = 4 if QUICK else 12
TORCH_DEVICE = sys.argv[sys.argv.index("--torch-device") + 1] if "--torch-device" in sys.argv else "cpu"
CASES = sys.argv[sys.argv.index("--cases") + 1].split(",") if "--cases" in sys.argv else ["cnn", "encoder"]
MODES = sys.argv[sys.argv.index("--modes") + 1].split(",") if "--modes" in sys.argv else ["eager", "compiled"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- the models, once in ember and once in torch ---------------------------------------------------

def ember_cnn(device):
    sys.path.insert(0, os.path.join(ROOT, "demos", "mnist"))
    from model import MnistNet
    return MnistNet().to(device).train()


class EncoderLayer(nn.Module):
    """A BERT layer as in demos/minilm: attention + residual + LayerNorm, GELU MLP + residual + LayerNorm."""

    def __init__(self, d=384, heads=12, inner=1536):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, inner)
        self.fc2 = nn.Linear(inner, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = ember.split(self.qkv(x), 3, axis=-1)                        # (b, s, d) each
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).permute(0, 2, 1, 3) for t in (q, k, v))
        a = ember.scaled_dot_product_attention(q, k, v)                       # (b, h, s, d/h)
        x = self.ln1(x + self.out(a.permute(0, 2, 1, 3).reshape(b, s, d)))
        return self.ln2(x + self.fc2(ember.gelu(self.fc1(x))))


def torch_models():
    import torch

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

    class TLayer(torch.nn.Module):
        def __init__(s, d=384, heads=12, inner=1536):
            super().__init__()
            s.heads = heads
            s.qkv, s.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            s.ln1, s.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            s.fc1, s.fc2 = torch.nn.Linear(d, inner), torch.nn.Linear(inner, d)

        def forward(s, x):
            b, n, d = x.shape
            q, k, v = (t.reshape(b, n, s.heads, d // s.heads).permute(0, 2, 1, 3) for t in s.qkv(x).chunk(3, -1))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            x = s.ln1(x + s.out(a.permute(0, 2, 1, 3).reshape(b, n, d)))
            return s.ln2(x + s.fc2(torch.nn.functional.gelu(s.fc1(x))))

    return TNet, TLayer


def cases(device):
    rng = np.random.default_rng(0)
    img = rng.random((64, 1, 28, 28), dtype=np.float32)
    lab = rng.integers(0, 10, 64)
    tok = rng.standard_normal((8, 128, 384)).astype(np.float32)
    tgt = rng.standard_normal((8, 128, 384)).astype(np.float32)
    out = []
    if "cnn" in CASES:
        net = ember_cnn(device)
        X, Y = ember.tensor(img, device=device), ember.tensor(lab, device=device)
        out.append(("mnist cnn b64", net, lambda m: F.cross_entropy(m(X), Y), (img, lab, "ce")))
    if "encoder" in CASES:
        layer = EncoderLayer().to(device)
        Xe, Te = ember.tensor(tok, device=device), ember.tensor(tgt, device=device)
        out.append(("encoder layer 8x128", layer, lambda m: F.mse_loss(m(Xe), Te), (tok, tgt, "mse")))
    return out


def train_step(model, loss_fn, opt, mode: str):
    """One Adam step of ``model`` on ``loss_fn(model)`` returning the loss, compiled or eager."""
    def body():
        opt.zero_grad()
        loss = loss_fn(model)
        loss.backward()
        opt.step()
        return loss
    return ember.compile(body) if mode == "compiled" else body


def main():
    import torch
    torch.set_num_threads(THREADS)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    TNet, TLayer = torch_models()
    rows = []
    for device in DEVICES:
        for mode in MODES:
            for name, model, loss_fn, (a, b, kind) in cases(device):
                opt = ember.optim.Adam(model.parameters(), lr=1e-3)
                tm = (TNet() if kind == "ce" else TLayer()).to(TORCH_DEVICE)
                topt = torch.optim.Adam(tm.parameters(), lr=1e-3)
                ta, tb = torch.tensor(a, device=TORCH_DEVICE), torch.tensor(b, device=TORCH_DEVICE)
                tloss_fn = (lambda m: torch.nn.functional.cross_entropy(m(ta), tb)) if kind == "ce" else \
                    (lambda m: torch.nn.functional.mse_loss(m(ta), tb))

                body = train_step(model, loss_fn, opt, mode)

                def e_step(body=body):
                    return body().item()

                def t_step(tm=tm, topt=topt, tloss_fn=tloss_fn):
                    topt.zero_grad()
                    loss = tloss_fn(tm)
                    loss.backward()
                    topt.step()
                    return loss.item()

                el, tl = e_step(), t_step()              # warm up (pipelines, caches, autotune, capture)
                for _ in range(3):
                    e_step()
                et, tt, gt = [], [], []
                timer = _timer(device)
                for _ in range(ROUNDS):
                    if timer is not None:
                        timer.start()
                    t0 = time.perf_counter()
                    e_step()
                    et.append(time.perf_counter() - t0)
                    if timer is not None:   # GPU time of the step's passes, checked against its wall time
                        g = timer.seconds()
                        gt.append(g)
                        if g is None or g > et[-1] * 1.05:
                            FAILURES.append(f"{name} {device} {mode}: GPU time "
                                            f"{'overflowed' if g is None else f'{g * 1e3:.2f} ms'} vs wall {et[-1] * 1e3:.2f} ms")
                    t0 = time.perf_counter()
                    t_step()
                    tt.append(time.perf_counter() - t0)
                if mode == "compiled" and not body.stats()["replays"]:
                    mode = "compiled (eager: " + next(iter(body.stats()["eager"].values()), "?")[:40] + ")"
                gpu = statistics.median([g for g in gt if g is not None]) if any(g is not None for g in gt) else None
                rows.append((name, f"{device} {mode}", min(et), statistics.median(et), min(tt),
                             statistics.median(tt), el, tl, gpu))
    print(f"{'case':22} {'ember':16} {'ember best':>11} {'median':>9} {'torch best':>11} {'median':>9} "
          f"{'ratio best':>10} {'median':>7}   first losses (ember, torch)")
    for name, dev, eb, em, tb, tmed, el, tl, gpu in rows:
        g = f"   GPU busy {gpu * 1e3:.2f} ms/step (median, summed pass timestamps)" if gpu is not None else ""
        print(f"{name:22} {dev:16} {eb * 1e3:9.1f}ms {em * 1e3:7.1f}ms {tb * 1e3:9.1f}ms {tmed * 1e3:7.1f}ms "
              f"{eb / tb:10.2f} {em / tmed:7.2f}   ({el:.4f}, {tl:.4f}){g}")
    print(f"(threads={THREADS}, torch {torch.__version__} on {TORCH_DEVICE}, rounds={ROUNDS})")
    if FAILURES:
        print("BENCHMARK FAILURES: " + "; ".join(FAILURES))
    elif any(r[-1] is not None for r in rows):
        print("benchmark checks: every step's summed GPU time within its wall time")


FAILURES: list = []
_TIMERS: dict = {}


def _timer(device):
    """bench_webgpu's PassTimer on the native webgpu driver (None elsewhere)."""
    if device != "webgpu":
        return None
    if "t" not in _TIMERS:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_webgpu import PassTimer
        from ember.webgpu.runtime import get_runtime

        _TIMERS["t"] = PassTimer.install(get_runtime())
    return _TIMERS["t"]


def host_main():
    """``--host``: host time and counts per step (see the module docstring)."""
    import cProfile
    import pstats

    from ember.webgpu.runtime import get_runtime

    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 5
    rt = get_runtime()
    drv = rt.driver
    counts = {"alloc": 0, "_bind_group": 0, "stream_submit": 0, "dispatch": 0}
    for name in list(counts):
        real = getattr(drv, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        setattr(drv, name, counted)
    # lavapipe runs the kernels inside queue.submit (and a write waits for them): time spent in
    # those calls is kernel time here, subtracted from the wall time (a real GPU returns at once)
    queue = drv._dev.queue
    waited = [0.0]
    for name in ("submit", "write_buffer"):
        real = getattr(queue, name)

        def timed(*a, _real=real, **k):
            t = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                waited[0] += time.perf_counter() - t
        setattr(queue, name, timed)
    print(f"{'case':22} {'mode':9} {'host ms/step':>12} {'median':>7} {'dispatches':>10} {'from Python':>11} "
          f"{'segments':>8} {'buffers':>7} {'bind groups':>11}   replay")
    for device in DEVICES:
        for mode in MODES:
            for name, model, loss_fn, _ in cases(device):
                body = train_step(model, loss_fn, ember.optim.Adam(model.parameters(), lr=1e-3), mode)
                for _ in range(4):               # warm up (pipelines, autotune, capture, recording)
                    body().item()
                ht, per = [], []
                prof = cProfile.Profile() if "--profile" in sys.argv else None
                for _ in range(steps):
                    c0, d0 = dict(counts), rt.stats["dispatches"]
                    w0 = waited[0]
                    t0 = time.perf_counter()
                    if prof is not None:
                        prof.enable()
                    loss = body()
                    drv.flush()
                    if prof is not None:
                        prof.disable()
                    ht.append(time.perf_counter() - t0 - (waited[0] - w0))
                    per.append({k: counts[k] - c0[k] for k in counts} | {"all": rt.stats["dispatches"] - d0})
                    loss.item()                  # drains the GPU before the next step's clock
                last = per[-1]
                how = "eager"
                if mode == "compiled":
                    plan = next((p for p in body.plans.values() if not isinstance(p, str)), None)
                    fast = getattr(plan, "fast", None)
                    d = fast.describe() if hasattr(fast, "describe") else None
                    how = f"{d}" if d is not None else ("step by step" if plan is not None else
                                                       f"eager: {body.stats()['eager']}")
                print(f"{name:22} {mode:9} {min(ht) * 1e3:10.2f}ms {statistics.median(ht) * 1e3:5.2f}ms "
                      f"{last['all']:10d} {last['dispatch']:11d} {last['stream_submit']:8d} {last['alloc']:7d} "
                      f"{last['_bind_group']:11d}   {how}")
                if prof is not None:
                    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    print(f"(steps={steps}, {drv.info.get('description') or drv.info.get('device')}, "
          f"load average {os.getloadavg()[0]:.2f})")


def kernels_main():
    """``--kernels``: every dispatch of one compiled step, and GPU time per kernel where timed."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import webgpu_kernels as wk
    from ember.plan import Plan
    from ember.webgpu.runtime import get_runtime

    rt = get_runtime()
    for name, model, loss_fn, _ in cases("webgpu"):
        body = train_step(model, loss_fn, ember.optim.Adam(model.parameters(), lr=1e-3), "compiled")
        for _ in range(4):               # warm up (pipelines, autotune, capture, recording)
            body().item()
        plan = next((p for p in body.plans.values() if isinstance(p, Plan)), None)
        if plan is None:
            print(f"== {name}: not compiled ({body.stats()['eager']})")
            continue
        step_us = wk.step_gpu_us(rt, body)
        noted = wk.capture(rt, plan)
        wk.time_each(rt, noted)
        fast = getattr(plan, "fast", None)
        print(wk.report(name, noted, step_us, listing="--no-list" not in sys.argv))
        if hasattr(fast, "describe"):
            print(f"  replay: {fast.describe()}")
    print(f"({rt.driver.info.get('description') or rt.driver.info.get('device')}, "
          f"load average {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    if "--kernels" in sys.argv:
        kernels_main()
    elif "--host" in sys.argv:
        host_main()
    else:
        main()
