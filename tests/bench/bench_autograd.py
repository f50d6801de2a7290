"""Eager op overhead with autodiff present but not recording, and the cost of recording.

    .venv/bin/python tests/bench/bench_autograd.py [--quick] [--isolate]

``--isolate`` times the same ops in one process with and without the two lines autodiff adds
to the hot path (the flag check in ``registry.apply`` and the ``_ag`` store in ``Tensor._wrap``),
interleaved, so other changes and machine noise cancel out.

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


def _without_hook():
    """Swap in registry.apply minus the autodiff check, and Tensor._wrap minus the ``_ag`` store
    (the two lines autodiff adds to every op), everywhere they were imported; returns undo()."""
    import inspect
    import textwrap

    from ember import registry
    from ember.tensor import Tensor

    src = textwrap.dedent(inspect.getsource(registry.apply))
    hook = ("    if GRAD[0]:\n        for t in inputs:\n            if t._ag is not None:\n"
            "                return GRAD_HOOK[0](OPS[name], inputs, attrs)\n")
    assert hook in src, "the hook lines changed; update the benchmark"
    ns = dict(vars(registry))
    exec(src.replace(hook, ""), ns)
    plain, orig = ns["apply"], registry.apply
    orig_wrap = Tensor.__dict__["_wrap"]

    def _wrap(cls, buf, shape, dtype, device):
        t = object.__new__(cls)
        t._buf = buf
        t.shape = tuple(shape)
        t.dtype = dtype
        t.device = device
        return t

    mods = [m for m in list(sys.modules.values()) if getattr(m, "apply", None) is orig]
    for m in mods:
        m.apply = plain
    Tensor._wrap = classmethod(_wrap)

    def undo():
        for m in mods:
            m.apply = orig
        Tensor._wrap = orig_wrap
    return undo


def isolate(rounds=5):
    """Same process, same tensors: ops with and without the autodiff lines, interleaved."""
    res = {}
    for device in ("python", "numpy"):
        c = cases(device)
        for _ in range(rounds):
            for variant in ("with", "without"):
                undo = _without_hook() if variant == "without" else (lambda: None)
                try:
                    for k, f in c.items():
                        v = best(f, 100)
                        key = (device, k, variant)
                        res[key] = min(res.get(key, 1e9), v)
                finally:
                    undo()
    print(f"{'device':7} {'op':8} {'without':>9} {'with':>9} {'delta':>8}   (us per op, best of runs; no tensor requires grad)")
    for device in ("python", "numpy"):
        for k in cases(device):
            a, b = res[(device, k, "without")], res[(device, k, "with")]
            print(f"{device:7} {k:8} {a:9.2f} {b:9.2f} {100 * (b - a) / a:+7.1f}%")


def main():
    if "--isolate" in sys.argv:
        return isolate()
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
