"""Produce tests/golden/grad_ops.safetensors once, with PyTorch: for every case of
tests/grad_cases.py, its inputs (float32 values), a random upstream gradient and the gradient of
each floating-point input, computed by torch.autograd in float64. torch is a golden-time tool
only; tests/test_autograd.py reads the committed file.

    .venv/bin/python tests/golden/make_grad_goldens.py

Layout: ``<case>/in<k>`` (float32, int64 or bool), ``<case>/up`` (the upstream gradient) and
``<case>/grad<k>`` (float32; only for floating inputs). Seeded; torch 2.13 CPU made the file.
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import ember  # noqa: E402
from grad_cases import CASES  # noqa: E402

OUT = os.path.join(HERE, "grad_ops.safetensors")


def make_input(spec, rng):
    kind, shape = spec[0], spec[1]
    if kind == "f":
        return rng.standard_normal(shape).astype(np.float32)
    if kind in ("pos", "cpos"):
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)
    if kind == "far":
        v = rng.standard_normal(shape).astype(np.float32)
        return (v + np.where(v >= 0, 0.25, -0.25)).astype(np.float32)   # no kink within 0.25
    if kind == "int":
        return rng.integers(0, spec[2], shape).astype(np.int64)
    if kind == "bool":
        return rng.random(shape) < 0.5
    raise ValueError(kind)


def spec_kind(case, k):
    return case.inputs[k][0]


def main():
    rng = np.random.default_rng(20261201)
    torch.set_default_dtype(torch.float64)
    out = {}
    for case in CASES:
        arrays = [make_input(s, rng) for s in case.inputs]
        ts = []
        for a in arrays:
            t = torch.from_numpy(a.astype(np.float64) if a.dtype == np.float32 else a)
            if t.is_floating_point() and spec_kind(case, len(ts)) != "cpos":
                t.requires_grad_(True)
            ts.append(t)
        y = case.torch(torch, F, *ts)
        up = rng.standard_normal(tuple(y.shape)).astype(np.float32)
        grads = torch.autograd.grad(y, [t for t in ts if t.requires_grad], torch.from_numpy(up.astype(np.float64)),
                                    allow_unused=True)
        for k, a in enumerate(arrays):
            out[f"{case.name}/in{k}"] = ember.tensor(a) if a.dtype != np.bool_ else ember.tensor(a.tolist(), dtype="bool")
        out[f"{case.name}/up"] = ember.tensor(up)
        it = iter(grads)
        for k, t in enumerate(ts):
            if t.requires_grad:
                g = next(it)
                g = torch.zeros_like(t) if g is None else g
                out[f"{case.name}/grad{k}"] = ember.tensor(g.detach().numpy().astype(np.float32))
    ember.save_safetensors(out, OUT)
    print(f"wrote {len(CASES)} cases to {OUT}")


if __name__ == "__main__":
    main()
