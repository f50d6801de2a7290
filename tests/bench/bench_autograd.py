"""Eager op overhead with autodiff present but not recording, and the cost of recording.

    .venv/bin/python tests/bench/bench_autograd.py [--quick]

Times tiny ops (where the per-op Python overhead of ``registry.apply`` dominates) on the python
and numpy backends in three states: no tensor has ever required grad (``fresh``), a tensor
requiring grad exists but the inputs do not (``armed``: the apply loop checks the inputs),
and the inputs require grad (``record``: a tape node per op). Reports the best of several
repeats in microseconds per op.
"""
from __future__ import annotations

import sys
import time

import ember

QUICK = "--quick" in sys.argv
# many short runs, best one: on a shared machine the minimum is the run nobody preempted
N = 100
REPEATS = 60 if QUICK else 300


def best(fn, n=N):
    out = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return min(out)


def cases(device, req=False):
    x = ember.tensor([1.0, 2.0, 3.0, 4.0], device=device)
    y = ember.tensor([0.5, 0.5, 0.5, 0.5], device=device)
    w = ember.ones((4, 4), device=device)
    if req:
        x.requires_grad_(True)
        w.requires_grad_(True)
    return {
        "add": lambda: x + y,
        "exp": lambda: x.exp(),
        "relu": lambda: ember.relu(x),
        "sum": lambda: x.sum(),
        "linear": lambda: ember.linear(x, w),
    }


def run(state, device):
    return {k: best(f) for k, f in cases(device, req=(state == "record")).items()}


def main():
    states = ["fresh"] if "--fresh-only" in sys.argv else ["fresh", "armed", "record"]
    rows = []
    for state in states:
        if state == "armed" and hasattr(ember.Tensor, "requires_grad"):
            keep = ember.tensor([1.0], requires_grad=True)  # noqa: F841  (arms the check)
        if state != "fresh" and not hasattr(ember.Tensor, "requires_grad"):
            continue
        for device in ("python", "numpy"):
            rows.append((state, device, run(state, device)))
    names = list(rows[0][2])
    print(f"{'state':8} {'device':7} " + " ".join(f"{n:>8}" for n in names) + "   (us per op, best of runs)")
    for state, device, r in rows:
        print(f"{state:8} {device:7} " + " ".join(f"{r[n]:8.2f}" for n in names))


if __name__ == "__main__":
    main()
