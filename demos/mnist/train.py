#!/usr/bin/env python3
"""Train the MNIST demo's CNN with ember alone (no PyTorch) and write the shipped weights.

    python demos/mnist/train.py --data DIR [--epochs 6] [--device numpy|webgpu] [--seed 0]
    python demos/mnist/train.py --data DIR --export-only   # only rewrite testdigits.json

``--data`` is a folder holding the four original MNIST IDX files (``train-images-idx3-ubyte.gz``
or ``train-images.idx3-ubyte.gz`` spellings both work; ``demos/train/data/`` holds a 6,000 +
1,000 image subset in the same layout). The network is ``model.py``'s ``MnistNet``, so the
weights keep PyTorch ``state_dict`` names and load in the demo, the tests and the page.

The recipe: ember autodiff, ``ember.optim.AdamW`` (weight decay 1e-4) with ``OneCycleLR``
stepped per batch, cross-entropy with label smoothing 0.1, batch 128, and a light random affine
augmentation of every training batch (rotation ±10°, scale 0.9–1.1, shift ±2 px: one
``affine_grid`` + bilinear ``grid_sample``, ember ops on the training device). The loop is
``ember.train.Learner`` (live dashboard on a terminal, plain lines otherwise; ``--checkpoints
DIR`` saves every epoch, ``--resume`` continues, ``q`` / Ctrl+C saves and stops).

Reproducible: the initial weights come from ``ember.manual_seed(seed)``, the batch order from the
DataLoader's seeded shuffle and the augmentation from ``random.Random`` seeded per epoch, so the
same seed gives bit-identical weights on the numpy backend (``tests/test_mnist_train.py``).

The weights are written only at ``--min-accuracy`` (99.2%) MNIST test accuracy or better, as
safetensors whose header metadata holds the test accuracy, epochs, seed, date, device and
recipe. Beside them ``testdigits.json``: the first 100 MNIST test images (uint8 pixels) with
their labels and the golden logits of the first 16, computed by ember's numpy backend (float32,
eval mode) from the written weights; the other backends are tested against those.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MIN_ACCURACY = 0.992


def _threads(n: int | None) -> None:
    # BLAS thread pools must be sized before numpy loads. On a busy machine one thread per
    # process is several times faster than OpenBLAS's spinning pool (measured: 2 cores shared
    # with other jobs, 100 ms vs 500 ms per batch-128 step); on an idle many-core machine pass more.
    if n:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(n)


def _load_local(name: str, file: str):
    """A module of this folder, loaded by path (other demos have their own ``model.py``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def model_module():
    return _load_local("ember_demo_mnist_model", "model.py")


# ---- data ------------------------------------------------------------------------------------

def load_split(data: str, split: str, limit: int | None = None):
    """(uint8 images (N, 1, 28, 28), int64 labels (N,)) ember tensors of ``split`` on the host."""
    import ember

    images, labels = _load_local("ember_demo_mnist_idx", "mnist_idx.py").read_split(data, split)
    if limit:
        images, labels = images[:limit], labels[:limit]
    host = "numpy" if "numpy" in ember.devices() else "python"
    x = ember.from_bytes(b"".join(images), (len(images), 1, 28, 28), "uint8", device=host)
    y = ember.tensor(list(labels), dtype="int64", device=host)
    return x, y


def affine_params(rng: random.Random, n: int, rotate: float = 10.0, scale: float = 0.1,
                  shift: float = 2.0) -> list:
    """``n`` random 2x3 sampling matrices (PyTorch's ``affine_grid`` convention, output ->
    input coordinates in [-1, 1]): rotation ±``rotate`` degrees, scale 1 ± ``scale``, shift
    ±``shift`` pixels."""
    out = []
    for _ in range(n):
        ang = math.radians(rng.uniform(-rotate, rotate))
        sc = 1.0 + rng.uniform(-scale, scale)
        tx, ty = rng.uniform(-shift, shift) / 14.0, rng.uniform(-shift, shift) / 14.0   # 14 px = 1.0
        c, s = math.cos(ang) / sc, math.sin(ang) / sc
        out.append([[c, -s, tx], [s, c, ty]])
    return out


def augment(x, rng: random.Random):
    """A random rotation/scale/shift of every image of the float batch ``x`` (N, 1, 28, 28):
    one affine grid and one bilinear sample, ember ops on ``x``'s device."""
    import ember
    from ember.onnx.functional import affine_grid, grid_sample

    theta = ember.tensor(affine_params(rng, x.shape[0]), dtype="float32", device=x.device)
    grid = affine_grid(theta, tuple(x.shape), align_corners=False)
    return grid_sample(x, grid, mode="linear", padding_mode="zeros", align_corners=False)


class Batches:
    """Training batches for the Learner: the DataLoader's uint8 batches on ``device`` as [0, 1]
    floats, augmented with a generator seeded per (seed, epoch), so a resumed run sees the same
    images."""

    def __init__(self, loader, seed: int, augmented: bool = True) -> None:
        self.loader, self.seed, self.augmented = loader, seed, augmented
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        rng = random.Random(f"{self.seed}/augment/{self.epoch}")
        for xb, yb in self.loader:
            xf = xb.astype("float32") / 255.0
            yield (augment(xf, rng) if self.augmented else xf), yb


class Scaled:
    """Evaluation batches: the uint8 images as [0, 1] floats."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for xb, yb in self.loader:
            yield xb.astype("float32") / 255.0, yb


def evaluate(net, x, y, device: str, batch: int = 1000) -> float:
    """Top-1 accuracy of ``net`` (eval mode) over uint8 images ``x`` and labels ``y``."""
    import ember
    from ember.train import DataLoader, TensorDataset, accuracy

    was = net.training
    net.eval()
    correct = 0
    with ember.no_grad():
        for xb, yb in Scaled(DataLoader(TensorDataset(x, y), batch_size=batch, device=device)):
            correct += accuracy(net(xb), yb)
    net.train(was)
    return correct / x.shape[0]


# ---- training --------------------------------------------------------------------------------

def train(x_train, y_train, *, epochs: int, device: str = "numpy", seed: int = 0, batch: int = 128,
          lr: float = 3e-3, weight_decay: float = 1e-4, label_smoothing: float = 0.1, augmented: bool = True,
          valid=None, checkpoints: str | None = None, resume: bool = False, dashboard="auto"):
    """Train a fresh ``MnistNet`` on uint8 images ``x_train`` (N, 1, 28, 28) and int64 labels;
    returns ``(net, learner)``. ``valid``: optional (images, labels) evaluated after every epoch."""
    import ember
    from ember.nn import functional as F
    from ember.train import DataLoader, Learner, TensorDataset

    ember.manual_seed(seed)
    net = model_module().MnistNet().to(device).train()
    loader = DataLoader(TensorDataset(x_train, y_train), batch_size=batch, shuffle=True, seed=seed, device=device)
    opt = ember.optim.AdamW(net.parameters(), lr=lr, weight_decay=weight_decay)
    sched = ember.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, epochs=epochs, steps_per_epoch=len(loader))
    learner = Learner(net, opt, lambda out, t: F.cross_entropy(out, t, label_smoothing=label_smoothing),
                      scheduler=sched, scheduler_step="batch", checkpoint_dir=checkpoints, dashboard=dashboard)
    val = Scaled(DataLoader(TensorDataset(*valid), batch_size=1000, device=device)) if valid is not None else None
    learner.fit(Batches(loader, seed, augmented), epochs=epochs, valid=val, resume=resume)
    return net.eval(), learner


# ---- outputs ---------------------------------------------------------------------------------

def save_weights(net, path: str, meta: dict) -> None:
    import ember

    sd = {k: v.to("numpy" if "numpy" in ember.devices() else "python") for k, v in net.state_dict().items()}
    ember.save_safetensors(sd, path, metadata={k: str(v) for k, v in meta.items()})


def export_testdigits(weights: str, x_test, y_test, path: str, n: int = 100, n_golden: int = 16) -> None:
    """The first ``n`` test digits (uint8, row major) + labels + golden logits of the first
    ``n_golden``, from ember's numpy backend (pure Python where numpy is missing)."""
    import ember

    mdl = model_module()
    dev = "numpy" if "numpy" in ember.devices() else "python"
    imgs = [bytes(x_test[i].to("python").reshape((784,)).tolist()) for i in range(n)]
    logits = mdl.logits(mdl.load_model(weights, device=dev), imgs[:n_golden], device=dev)
    doc = {
        "source": "MNIST test set (t10k), first images in file order; CC BY-SA 3.0, see DATA_LICENSE.md",
        "shape": [28, 28],
        "labels": [int(v) for v in y_test[:n].tolist()],
        # One hex string per image (784 bytes): compact and trivially decoded in pure Python.
        "images_hex": [img.hex() for img in imgs],
        "golden": {
            "producer": f"ember {ember.__version__} {dev} backend, float32, eval mode, input = pixels / 255 "
                        f"(weights: {os.path.basename(weights)})",
            "count": n_golden,
            "logits": [[round(float(v), 7) for v in row] for row in logits],
        },
    }
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="folder with the MNIST IDX .gz files")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3, help="OneCycle's peak learning rate")
    ap.add_argument("--device", default="numpy", help="ember device to train on (numpy, webgpu, ...)")
    ap.add_argument("--threads", type=int, default=None,
                    help="BLAS threads (default: the library's; 1 is fastest on a busy machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=None, help="train on the first N images only (quick tries)")
    ap.add_argument("--no-augment", action="store_true")
    ap.add_argument("--out", default=os.path.join(HERE, "mnist.safetensors"))
    ap.add_argument("--digits-out", default=os.path.join(HERE, "testdigits.json"))
    ap.add_argument("--min-accuracy", type=float, default=MIN_ACCURACY,
                    help="refuse to write weights below this test accuracy")
    ap.add_argument("--checkpoints", default=None, help="save a checkpoint folder per epoch here")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --checkpoints")
    ap.add_argument("--export-only", action="store_true",
                    help="load --out and only rewrite the test digits / golden logits")
    args = ap.parse_args(argv)
    _threads(args.threads)

    import ember

    if args.device not in ember.devices():
        ap.error(f"device {args.device!r} is not available here (ember.devices(): {ember.devices()})")
    x_te, y_te = load_split(args.data, "test")

    if args.export_only:
        net = model_module().load_model(args.out, device=args.device)
        print(f"test accuracy of {args.out} on {args.device}: {evaluate(net, x_te, y_te, args.device):.4f}")
        export_testdigits(args.out, x_te, y_te, args.digits_out)
        print(f"wrote {args.digits_out}")
        return 0

    x_tr, y_tr = load_split(args.data, "train", args.limit)
    t0 = time.time()
    net, learner = train(x_tr, y_tr, epochs=args.epochs, device=args.device, seed=args.seed, batch=args.batch,
                         lr=args.lr, augmented=not args.no_augment, valid=(x_te, y_te),
                         checkpoints=args.checkpoints, resume=args.resume)
    hist = learner.history
    if learner.stopped_by == "interrupt":
        print("interrupted: weights NOT written", file=sys.stderr)
        return 130
    acc = hist["valid_accuracy"][-1]
    secs = hist.get("seconds", [])
    print(f"trained {len(secs)} epochs in {time.time() - t0:.0f} s "
          f"({sum(secs) / max(len(secs), 1):.0f} s of training per epoch); test accuracy {acc:.4f}")
    if acc < args.min_accuracy:
        print(f"test accuracy {acc:.4f} < {args.min_accuracy}: weights NOT written", file=sys.stderr)
        return 1
    meta = {
        "format": "pt",
        "model": "ember MNIST demo CNN (demos/mnist/model.py)",
        "test_accuracy": f"{acc:.4f}",
        "epochs": args.epochs,
        "seed": args.seed,
        "device": args.device,
        "date": datetime.date.today().isoformat(),
        "input": "1x28x28 float32 pixels in [0,1], white digit on black; normalised inside the model",
        "normalize_mean": model_module().MEAN,
        "normalize_std": model_module().STD,
        "trainer": f"ember {ember.__version__} (demos/mnist/train.py)",
        "recipe": f"AdamW(lr={args.lr}, weight_decay=1e-4) + OneCycleLR per batch, batch {args.batch}, "
                  f"cross_entropy(label_smoothing=0.1), "
                  f"{'no augmentation' if args.no_augment else 'random affine: rot 10 deg, scale 0.1, shift 2 px'}"
                  + (f", first {args.limit} training images" if args.limit else ""),
    }
    save_weights(net, args.out, meta)
    export_testdigits(args.out, x_te, y_te, args.digits_out)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes) and {args.digits_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
