"""``python -m ember.examples mnist``: train the MNIST demo's CNN (``demos/mnist/model.py``) with
the demo's own recipe (``demos/mnist/train.py``: AdamW + OneCycleLR, label smoothing, random affine
augmentation, the ``Learner`` and its dashboard) and report the test accuracy. Nothing is written
unless ``--out`` is given.

Data: ``demos/train/data/`` (6,000 training and 1,000 test images of MNIST, committed) unless
``--data DIR`` names a folder with the full IDX files. ``--quick`` trains on 512 images for one
epoch without augmentation and tests on 500 (a smoke test, under a minute on the numpy backend).
This example runs from an ember source checkout (it reuses the demo's code and data).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import ember

from . import source_root


def demo_module():
    """``demos/mnist/train.py`` as a module (it loads the demo's model.py and IDX reader)."""
    root = source_root()
    if root is None:
        raise FileNotFoundError("the mnist example reuses demos/mnist from an ember source checkout; run it "
                                "from one (git clone, then `python -m ember.examples mnist` in it)")
    name = "ember_demo_mnist_train"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(root, "demos", "mnist", "train.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def default_data() -> str:
    root = source_root()
    return os.path.join(root, "demos", "train", "data") if root else ""


class BatchLosses:
    """A Learner dashboard that also keeps every batch's loss (the test reads them)."""

    def __init__(self, inner):
        self.inner, self.losses = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def batch(self, learner, epoch, epochs, i, batches, metrics):
        self.losses.append(metrics["loss"])
        self.inner.batch(learner, epoch, epochs, i, batches, metrics)

    def epoch(self, learner, epoch, epochs, metrics):
        self.inner.epoch(learner, epoch, epochs, metrics)


def run(*, data: str | None = None, epochs: int = 2, limit: int | None = None, test_limit: int | None = None,
        batch: int = 128, lr: float = 3e-3, augment: bool = True, device: str | None = None, seed: int = 0,
        dashboard="auto", out: str | None = None) -> dict:
    """Train; return {history, batch_losses, test_accuracy, train_images, test_images}."""
    from ember.train import make_dashboard

    demo = demo_module()
    device = device or ("numpy" if "numpy" in ember.devices() else "python")
    data = data or default_data()
    x_tr, y_tr = demo.load_split(data, "train", limit)
    x_te, y_te = demo.load_split(data, "test", test_limit)
    dash = BatchLosses(make_dashboard(dashboard))
    net, learner = demo.train(x_tr, y_tr, epochs=epochs, device=device, seed=seed, batch=batch, lr=lr,
                              augmented=augment, dashboard=dash)
    acc = demo.evaluate(net, x_te, y_te, device)
    if out:
        demo.save_weights(net, out, {"format": "pt", "test_accuracy": f"{acc:.4f}", "epochs": epochs,
                                     "trainer": "python -m ember.examples mnist"})
    return {"history": learner.history, "batch_losses": dash.losses, "test_accuracy": acc,
            "train_images": x_tr.shape[0], "test_images": x_te.shape[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ember.examples mnist", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=None, help="folder with MNIST IDX .gz files (default: demos/train/data)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="512 images, 1 epoch, no augmentation")
    ap.add_argument("--device", default=None, help="numpy (default where installed), python, wasm, webgpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the trained weights (safetensors) here")
    a = ap.parse_args(argv)
    kw = dict(epochs=1, limit=512, test_limit=500, batch=64, augment=False) if a.quick else dict(epochs=a.epochs)
    r = run(data=a.data, device=a.device, seed=a.seed, out=a.out, **kw)
    print(f"trained on {r['train_images']} images; test accuracy {r['test_accuracy']:.2%} "
          f"on {r['test_images']} test images" + (f"; weights in {a.out}" if a.out else ""))
    return 0
