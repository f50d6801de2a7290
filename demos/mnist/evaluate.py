#!/usr/bin/env python3
"""Accuracy of the shipped MNIST weights with ember, on every backend, with timings.

    python demos/mnist/evaluate.py --data /path/to/mnist                    # full 10k test set
    python demos/mnist/evaluate.py --data DIR --device numpy,webgpu --limit 2000
    python demos/mnist/evaluate.py                                            # the 100 committed digits

Without ``--data`` it uses ``testdigits.json`` (the first 100 test images, committed). The
pure-Python backend runs about a million multiply-adds per image in the interpreter: the full
test set takes minutes there (that is what this script is for; the test suite uses a few digits).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if not os.environ.get("XDG_RUNTIME_DIR"):
    # Mesa's Vulkan driver (lavapipe, behind the native webgpu backend) complains without one.
    import tempfile

    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ember-xdg-")

import ember  # noqa: E402
from ember.errors import DeviceError  # noqa: E402

import model as mnist  # noqa: E402
from mnist_idx import read_split, read_testdigits  # noqa: E402


def evaluate(net, images, labels, device: str, batch: int, progress=True) -> dict:
    """Run ``net`` over all images in batches; returns accuracy, counts and throughput."""
    correct = 0
    t0 = time.perf_counter()
    for start in range(0, len(images), batch):
        chunk = images[start:start + batch]
        for row, label in zip(mnist.logits(net, chunk, device), labels[start:start + batch]):
            correct += mnist.argmax(row) == label
        done = start + len(chunk)
        if progress:
            dt = time.perf_counter() - t0
            print(f"\r  {device:7s} {done:6d}/{len(images)}  acc {correct / done:.4f}  "
                  f"{done / dt:8.1f} img/s", end="", flush=True)
    seconds = time.perf_counter() - t0
    if progress:
        print()
    return {"device": device, "n": len(images), "correct": correct,
            "accuracy": correct / len(images), "seconds": seconds,
            "images_per_s": len(images) / seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="folder with the MNIST IDX .gz files (default: testdigits.json)")
    ap.add_argument("--device", default="python,numpy,webgpu",
                    help="comma-separated backends (unavailable ones are reported and skipped)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N test images")
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--weights", default=os.path.join(HERE, "mnist.safetensors"))
    args = ap.parse_args(argv)

    if args.data:
        images, labels = read_split(args.data, "test")
        source = f"MNIST test set in {args.data}"
    else:
        doc = read_testdigits()
        images, labels = doc["images"], doc["labels"]
        source = "testdigits.json"
    if args.limit:
        images, labels = images[:args.limit], labels[:args.limit]
    print(f"{len(images)} images from {source}; weights {args.weights}")

    results = []
    for device in [d.strip() for d in args.device.split(",") if d.strip()]:
        try:
            ember.get_backend(device)
        except DeviceError as e:
            print(f"  {device:7s} skipped: {e}")
            continue
        t0 = time.perf_counter()
        net = mnist.load_model(args.weights, device)
        load_s = time.perf_counter() - t0
        r = evaluate(net, images, labels, device, args.batch)
        r["load_s"] = load_s
        results.append(r)

    print(f"\n{'device':8s} {'accuracy':>9s} {'correct':>13s} {'seconds':>9s} {'img/s':>9s}")
    for r in results:
        print(f"{r['device']:8s} {r['accuracy']:9.4f} {r['correct']:6d}/{r['n']:<6d} "
              f"{r['seconds']:9.1f} {r['images_per_s']:9.1f}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
