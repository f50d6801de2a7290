#!/usr/bin/env python3
"""Train the MNIST demo's small CNN with PyTorch and write the shipped weights.

    python demos/mnist/train.py --data /path/to/mnist [--epochs 8] [--out demos/mnist/mnist.safetensors]
    python demos/mnist/train.py --data /path/to/mnist --export-only   # only rewrite testdigits.json

``--data`` is a folder holding the four original MNIST IDX files (``train-images-idx3-ubyte.gz``
or ``train-images.idx3-ubyte.gz`` spellings both work). PyTorch is needed here only: the
demo, the tests and the page run the same network with ember (``model.py``).

Besides the weights (safetensors, PyTorch state_dict names, metadata: accuracy, epochs, date),
the script writes ``testdigits.json``: the first 100 MNIST test images (uint8 pixels) with their
labels, and PyTorch's logits for the first 16 of them: the golden outputs the ember tests compare
against.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))

# Normalisation folded into the network input: the page and model.py feed pixels in [0, 1] and
# the first layer sees (x - MEAN) / STD. Kept here and in model.py (same numbers).
MEAN, STD = 0.1307, 0.3081


class Net(nn.Module):
    """conv(1->16)+BN+ReLU+pool -> conv(16->32)+BN+ReLU+pool -> fc(1568->64)+ReLU -> fc(64->10).

    About 1.1 M multiply-adds per image, 106 k parameters: small enough for the pure-Python
    backend in the page.
    """

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = (x - MEAN) / STD
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


# ---- data ------------------------------------------------------------------------------------

def load_mnist(data: str) -> dict:
    """{"train": (uint8 N x 28 x 28, uint8 N), "test": (...)} from the IDX files in ``data``."""
    sys.path.insert(0, HERE)
    from mnist_idx import read_split

    out = {}
    for split in ("train", "test"):
        images, labels = read_split(data, split)
        x = np.frombuffer(b"".join(images), dtype=np.uint8).reshape(-1, 28, 28)
        out[split] = (x, np.array(labels, dtype=np.uint8))
    return out


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random rotation (±10°), scale (0.9–1.1) and shift (±2 px) of a batch, one affine warp."""
    n = x.shape[0]
    ang = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(10)
    sc = 1 + (torch.rand(n, generator=gen) * 2 - 1) * 0.1
    tx = (torch.rand(n, generator=gen) * 2 - 1) * (2 / 14)  # grid units: 14 px = 1.0
    ty = (torch.rand(n, generator=gen) * 2 - 1) * (2 / 14)
    cos, sin = torch.cos(ang) / sc, torch.sin(ang) / sc
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, align_corners=False, padding_mode="zeros")


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(x), 1000):
        correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    return correct / len(x)


# ---- outputs ---------------------------------------------------------------------------------

def save_weights(model: nn.Module, path: str, meta: dict) -> None:
    from safetensors.torch import save_file

    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(sd, path, metadata={k: str(v) for k, v in meta.items()})


@torch.no_grad()
def export_testdigits(model: nn.Module, x_test: np.ndarray, y_test: np.ndarray, path: str,
                      n: int = 100, n_golden: int = 16) -> None:
    """The first ``n`` test digits (uint8, row major) + labels + PyTorch golden logits."""
    model.eval()
    xs = torch.from_numpy(x_test[:n_golden].astype(np.float32) / 255.0).unsqueeze(1)
    logits = model(xs).double().numpy()
    doc = {
        "source": "MNIST test set (t10k), first images in file order; CC BY-SA 3.0, see DATA_LICENSE.md",
        "shape": [28, 28],
        "labels": [int(v) for v in y_test[:n]],
        # One hex string per image (784 bytes): compact and trivially decoded in pure Python.
        "images_hex": [bytes(img.reshape(-1)).hex() for img in x_test[:n]],
        "golden": {
            "producer": f"PyTorch {torch.__version__}, float32, eval mode, input = pixels / 255",
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
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(HERE, "mnist.safetensors"))
    ap.add_argument("--digits-out", default=os.path.join(HERE, "testdigits.json"))
    ap.add_argument("--min-accuracy", type=float, default=0.99,
                    help="refuse to write weights below this test accuracy")
    ap.add_argument("--export-only", action="store_true",
                    help="load --out and only rewrite the test digits / golden logits")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = load_mnist(args.data)
    x_tr = torch.from_numpy(data["train"][0].astype(np.float32) / 255.0).unsqueeze(1)
    y_tr = torch.from_numpy(data["train"][1].astype(np.int64))
    x_te = torch.from_numpy(data["test"][0].astype(np.float32) / 255.0).unsqueeze(1)
    y_te = torch.from_numpy(data["test"][1].astype(np.int64))
    model = Net()

    if args.export_only:
        from safetensors.torch import load_file

        model.load_state_dict(load_file(args.out), strict=True)
        print(f"test accuracy of {args.out}: {evaluate(model, x_te, y_te):.4f}")
        export_testdigits(model, data["test"][0], data["test"][1], args.digits_out)
        print(f"wrote {args.digits_out}")
        return 0

    steps_per_epoch = math.ceil(len(x_tr) / args.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, epochs=args.epochs,
                                                steps_per_epoch=steps_per_epoch)
    gen = torch.Generator().manual_seed(args.seed)
    t0 = time.time()
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(len(x_tr), generator=gen)
        total, seen = 0.0, 0
        for i in range(0, len(x_tr), args.batch):
            idx = perm[i:i + args.batch]
            xb = augment(x_tr[idx], gen)
            loss = F.cross_entropy(model(xb), y_tr[idx], label_smoothing=0.05)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
            seen += len(idx)
        acc = evaluate(model, x_te, y_te)
        print(f"epoch {epoch}/{args.epochs}  loss {total / seen:.4f}  test acc {acc:.4f}  "
              f"({time.time() - t0:.0f} s)", flush=True)

    if acc < args.min_accuracy:
        print(f"test accuracy {acc:.4f} < {args.min_accuracy}: weights NOT written", file=sys.stderr)
        return 1
    meta = {
        "format": "pt",
        "model": "ember MNIST demo CNN (demos/mnist/model.py)",
        "test_accuracy": f"{acc:.4f}",
        "epochs": args.epochs,
        "date": datetime.date.today().isoformat(),
        "input": "1x28x28 float32 pixels in [0,1], white digit on black; normalised inside the model",
        "normalize_mean": MEAN,
        "normalize_std": STD,
        "trainer": f"PyTorch {torch.__version__}",
    }
    save_weights(model, args.out, meta)
    export_testdigits(model, data["test"][0], data["test"][1], args.digits_out)
    print(f"final test accuracy {acc:.4f}; wrote {args.out} ({os.path.getsize(args.out)} bytes) "
          f"and {args.digits_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
