"""The Python half of the training page: runs inside Pyodide in the page's ember Worker.

demo.js has the worker fetch this file, ``mnist_idx.py`` (from demos/mnist/) and the MNIST
subset (``data/``: 6,000 training and 1,000 held-back test digits, IDX files) into Pyodide's
file system, calls ``setup(folder)``, then drives training in chunks: ``reset(backend, batch)``
makes a fresh network and optimizer, every ``await steps(n)`` runs ``n`` optimizer steps and
returns their losses (the page draws them and can pause between chunks), ``await
evaluate()`` measures accuracy on the held-back digits, ``await predict(pixels)`` reads a
drawing, ``weights()`` is the trained model as safetensors bytes. Plain ember: the same calls
run in CPython (tests/test_mnist_train.py imports this module).

The network is ``TrainNet``, smaller than the MNIST demo's ``MnistNet``: two strided
convolutions (no padding, no pooling, no batch norm) and two linear layers, 57 k parameters and
0.22 M multiply-adds per image against 106 k and 1.1 M. Measured in CPython on the wasm backend
(batch 32, Adam): 40 ms per step for ``TrainNet``, about 2 s for ``MnistNet`` (its padded
convolutions, pooling and batch norm backward run partly on the pure-Python kernels), so a few
hundred steps take seconds instead of minutes. With Adam and a one-cycle learning rate
(peak 0.003) it reaches about 94% on the held-back digits after 300 steps of batch 32, 92% after
150.

>>> import os
>>> here = os.path.dirname(os.path.abspath(__file__))
>>> setup(os.path.join(here, "data"))["train"]
6000
"""
from __future__ import annotations

import gzip
import math
import os
import random
import time
from array import array

import ember
from ember import nn
from ember.nn import functional as F

import mnist_idx

# The page's names for the backends -> ember device names (as in demos/mnist/app.py).
DEVICES = {"cpu": "wasm" if "wasm" in ember.devices() else "python", "webgpu": "webgpu", "python": "python"}
MEAN, STD = 0.1307, 0.3081
PIXELS = 784


class TrainNet(nn.Module):
    """conv(1->16, 5x5, stride 2)+ReLU -> conv(16->32, 3x3, stride 2)+ReLU -> fc(800->64)+ReLU
    -> fc(64->10). Input: (N, 1, 28, 28) pixels in [0, 1]."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, stride=2)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)
        self.relu = nn.ReLU()
        self.flatten = nn.Flatten()

    def forward(self, x):
        x = (x - MEAN) / STD                               # (N, 1, 28, 28)
        x = self.relu(self.conv1(x))                       # (N, 16, 12, 12)
        x = self.relu(self.conv2(x))                       # (N, 32, 5, 5)
        x = self.relu(self.fc1(self.flatten(x)))           # (N, 64)
        return self.fc2(x)                                 # (N, 10) logits


class _State:
    data: dict = {}          # split -> (images: bytes, N*784; labels: list)
    net = None
    opt = None
    sched = None
    backend = "cpu"
    batch = 32
    step = 0
    rng = None
    order: list = []
    trained_on: str = ""


S = _State()


def _read(folder: str, stem: str):
    path = mnist_idx.find_idx(folder, stem)
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":          # served as it is (gzip); a server may also have decoded it
        raw = gzip.decompress(raw)
    return mnist_idx.parse_idx(raw, path)


def setup(folder: str) -> dict:
    """Read the MNIST subset (IDX files as in demos/mnist/mnist_idx.py) from ``folder``."""
    for split, prefix in (("train", "train"), ("test", "t10k")):
        (n, h, w), pix = _read(folder, f"{prefix}-images")
        (m,), lab = _read(folder, f"{prefix}-labels")
        if (h, w) != (28, 28) or m != n:
            raise ValueError(f"{folder}: {split} images {(n, h, w)} and labels {m} do not match")
        S.data[split] = (bytes(pix), list(lab))
    reset("cpu", 32)
    return {"train": len(S.data["train"][1]), "test": len(S.data["test"][1]), "devices": dict(DEVICES)}


def _device(backend: str) -> str:
    if backend not in DEVICES:
        raise ValueError(f"unknown backend {backend!r}: use 'cpu', 'webgpu' or 'python'")
    return DEVICES[backend]


def _images(split: str, idx, device: str):
    """(len(idx), 1, 28, 28) float32 in [0, 1] of the given images, on ``device``."""
    pix = S.data[split][0]
    raw = b"".join(pix[i * PIXELS:(i + 1) * PIXELS] for i in idx)
    cpu = DEVICES["cpu"]      # uint8 -> float on the CPU, one float32 upload to the GPU
    x = ember.from_bytes(raw, (len(idx), 1, 28, 28), "uint8", device=cpu).astype("float32") / 255.0
    return x.to(device) if device != cpu else x


def _labels(split: str, idx, device: str):
    lab = S.data[split][1]
    return ember.tensor([lab[i] for i in idx], dtype="int64", device=device)


def reset(backend: str = "cpu", batch: int = 32, seed: int = 0, lr: float = 3e-3, total_steps: int | None = None) -> dict:
    """A fresh ``TrainNet`` (seeded initialisation) and Adam optimizer on ``backend``; with
    ``total_steps``, a one-cycle learning-rate schedule over that many steps (peak ``lr``),
    else a constant ``lr``."""
    if not 1 <= int(batch) <= 1024:
        raise ValueError(f"batch must be 1..1024, got {batch}")
    dev = _device(backend)
    ember.manual_seed(int(seed))
    S.net = TrainNet().to(dev).train()
    S.opt = ember.optim.Adam(S.net.parameters(), lr=float(lr))
    S.sched = ember.optim.lr_scheduler.OneCycleLR(S.opt, max_lr=float(lr), total_steps=int(total_steps)) \
        if total_steps else None
    # One training step, compiled: after its first two calls (captures) every step replays the
    # recorded forward/backward kernels and calls the optimizer's step, skipping the model's
    # Python (bit-identical to eager; the page's per-step cost is mostly Python in Pyodide)
    S.train_step = ember.compile(_train_step)
    S.backend, S.batch, S.step = backend, int(batch), 0
    S.rng = random.Random(int(seed))
    S.order = []
    S.trained_on = dev
    return {"backend": backend, "device": dev, "batch": S.batch,
            "parameters": sum(p.size for p in S.net.parameters())}


def _next_batch() -> list:
    if len(S.order) < S.batch:      # a fresh shuffled epoch of the training digits
        idx = list(range(len(S.data["train"][1])))
        S.rng.shuffle(idx)
        S.order += idx
    out, S.order = S.order[:S.batch], S.order[S.batch:]
    return out


def _train_step(x, y):
    """Forward, backward and Adam step on one batch: (loss, correct predictions in the batch)."""
    S.opt.zero_grad()
    out = S.net(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    S.opt.step()
    return loss, (ember.argmax(out, axis=1) == y).astype("int64").sum()


async def steps(n: int) -> dict:
    """Run ``n`` optimizer steps; ``{"losses", "correct" (per step, of the batch), "step",
    "ms"}``."""
    if S.net is None:
        raise RuntimeError("no model: call setup(folder) first")
    dev = DEVICES[S.backend]
    losses, correct = [], []
    t0 = time.perf_counter()
    for _ in range(int(n)):
        idx = _next_batch()
        x, y = _images("train", idx, dev), _labels("train", idx, dev)
        loss, hit = S.train_step(x, y)
        if S.sched is not None and S.sched.last_epoch + 1 < S.sched.total_steps:
            S.sched.step()
        lv, hv = await loss.data_async(), await hit.data_async()
        losses.append(float(lv))
        correct.append(int(hv) / len(idx))
        S.step += 1
    return {"losses": losses, "correct": correct, "step": S.step, "ms": (time.perf_counter() - t0) * 1000}


async def evaluate(limit: int | None = None, batch: int = 250) -> dict:
    """Accuracy of the current network on the held-back test digits (all 1,000 or the first
    ``limit``), in eval mode, without recording."""
    n = len(S.data["test"][1]) if not limit else min(int(limit), len(S.data["test"][1]))
    dev = DEVICES[S.backend]
    S.net.eval()
    right = 0
    t0 = time.perf_counter()
    try:
        for s in range(0, n, batch):
            idx = list(range(s, min(n, s + batch)))
            with ember.no_grad():
                pred = ember.argmax(S.net(_images("test", idx, dev)), axis=1)
            # Awaited outside no_grad: grad mode is global, and other calls (start_webgpu) run
            # while this one waits.
            got = await pred.data_async()
            lab = S.data["test"][1]
            right += sum(1 for i, p in zip(idx, got) if int(p) == lab[i])
    finally:
        S.net.train()
    return {"accuracy": right / n, "count": n, "ms": (time.perf_counter() - t0) * 1000}


def _pixels(pixels) -> array:
    # From the worker: a Float32Array arrives as a memoryview of format "f"; from Python: any
    # sequence of 784 floats.
    if isinstance(pixels, memoryview) and pixels.format == "f":
        px = array("f", pixels.cast("B").tobytes())
    elif hasattr(pixels, "to_bytes"):
        px = array("f", pixels.to_bytes())
    else:
        px = array("f", [float(v) for v in pixels])
    if len(px) != PIXELS:
        raise ValueError(f"predict: got {len(px)} pixels, expected {PIXELS} (28x28 row major)")
    if not all(math.isfinite(v) for v in px):
        raise ValueError("predict: pixels must be finite numbers")
    return px


async def predict(pixels) -> dict:
    """``{"digit", "probs"}`` of the current network for one 28x28 image of [0, 1] pixels."""
    px = _pixels(pixels)
    dev = DEVICES[S.backend]
    x = ember.from_bytes(px.tobytes(), (1, 1, 28, 28), "float32", device=dev)
    S.net.eval()
    try:
        with ember.no_grad():
            out = ember.softmax(S.net(x), axis=-1)
    finally:
        S.net.train()
    probs = (await out.data_async())[0]
    probs = [float(p) for p in probs]
    return {"digit": max(range(10), key=lambda d: probs[d]), "probs": probs}


def weights() -> bytes:
    """The current network's state_dict as safetensors bytes (PyTorch names; loads with
    ``ember.load_safetensors`` into ``TrainNet``)."""
    sd = {k: v.to("python") for k, v in S.net.state_dict().items()}
    meta = {"model": "TrainNet (demos/train/app.py)", "steps": str(S.step), "batch": str(S.batch),
            "backend": S.backend, "device": S.trained_on, "optimizer": "Adam",
            "data": "MNIST subset, CC BY-SA 3.0 (demos/train/DATA_LICENSE.md)"}
    return ember.save_safetensors(sd, metadata=meta)


async def start_webgpu() -> dict:
    """Compile the WebGPU pipelines training and prediction use (one step of a throwaway
    network on a small batch), so that the first WebGPU run does not pay for them."""
    import ember.webgpu
    from ember.webgpu import autotune

    # As in demos/mnist/app.py: autotune benchmarks every matmul variant on first use, seconds
    # on a software adapter; the default variants serve these small shapes well.
    autotune.set_enabled(False)
    t0 = time.perf_counter()
    net = TrainNet().to("webgpu").train()
    opt = ember.optim.Adam(net.parameters(), lr=1e-3)
    idx = list(range(8))
    x, y = _images("train", idx, "webgpu"), _labels("train", idx, "webgpu")
    loss = F.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
    await loss.data_async()
    net.eval()
    with ember.no_grad():
        out = ember.softmax(net(x[:1]), axis=-1)
    await out.data_async()
    return {"ms": (time.perf_counter() - t0) * 1000, "pipelines": ember.webgpu.stats()["pipelines_compiled"],
            "fallback_adapter": ember.webgpu.info().get("adapter_type") == "fallback"}


def samples() -> list:
    """One held-back test digit per class (the first of each): ``[{"label", "index", "pixels"}]``
    with ``pixels`` the 784 uint8 bytes, for the page's sample buttons."""
    pix, lab = S.data["test"]
    out, seen = [], set()
    for i, d in enumerate(lab):
        if d not in seen:
            seen.add(d)
            out.append({"label": d, "index": i, "pixels": pix[i * PIXELS:(i + 1) * PIXELS]})
    return sorted(out, key=lambda s: s["label"])
