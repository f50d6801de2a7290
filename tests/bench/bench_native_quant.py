"""The numpy backend's quantized ops with and without ember.native's quant.c (the wasm kernels
compiled for this CPU through SIMDe): ms per ``quant.linear`` call per format, shape and rows of x,
the two paths alternating in one process (best of ``--reps`` each, twice), with the load average.

    python tests/bench/bench_native_quant.py [--formats q4_1,q8_0,q4_k] [--shapes 1536x1024,576x1536]
                                             [--rows 1,4,64,256] [--reps 10]

Weights are random quants with block scales of a real model's size (normal halves: subnormal
scales would time the CPU's subnormal arithmetic). Numbers: notes/native-quant.md.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import ember
from ember import quant
from ember.backends import numpy_quant as nq
from bench_quant import best_ms     # (run as a script: tests/bench is on sys.path)

# byte offsets of each block format's float16 scales
HALVES = {"q8_0": (0,), "q4_0": (0,), "q5_0": (0,), "q4_1": (0, 2), "q5_1": (0, 2), "q4_k": (0, 2), "q5_k": (0, 2),
          "q6_k": (208,), "q3_k": (108,), "q2_k": (80, 82), "iq4_nl": (0,), "iq4_xs": (0,)}


def weight(qtype: str, n: int, k: int, rng) -> quant.QTensor:
    f = quant.FORMATS[qtype]
    if f.block == 1:
        vals = rng.normal(size=(n, k)).astype(np.float32) * 0.02
        raw = {"f32": vals, "f16": vals.astype(np.float16),
               "bf16": (vals.view(np.uint32) >> 16).astype(np.uint16)}[qtype].view(np.uint8)
    else:
        raw = rng.integers(0, 256, size=(n * k // f.block, f.nbytes), dtype=np.uint8)
        for off in HALVES[qtype]:
            raw[:, off:off + 2] = rng.uniform(1e-3, 2e-2, size=(len(raw), 1)).astype(np.float16).view(np.uint8)
    return quant.QTensor.from_bytes(raw.tobytes(), qtype, (n, k), device="numpy")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="q4_1,q8_0,q4_k,q6_k")
    ap.add_argument("--shapes", default="576x576,1536x576,576x1536,2048x2048,49152x576")
    ap.add_argument("--rows", default="1")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    native_fn = nq._native_fn
    if not nq.native_qlinear():
        raise SystemExit(f"ember.native has no quant kernels here: {ember.native.info()}")
    rng = np.random.default_rng(0)
    print(f"load average {os.getloadavg()}")
    for qtype in a.formats.split(","):
        for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
            if k % quant.FORMATS[qtype].block:
                continue
            w = weight(qtype, n, k, rng)
            for m in (int(r) for r in a.rows.split(",")):
                x = ember.from_numpy(rng.normal(size=(m, k)).astype(np.float32), device="numpy")
                reps = a.reps if n * k * m < 1 << 24 else max(3, a.reps // 3)
                t = {False: [], True: []}
                for _ in range(2):
                    for on in (False, True):
                        nq._native_fn = native_fn if on else (lambda name: None)
                        t[on].append(best_ms(lambda: quant.linear(x, w).numpy(), reps))
                nq._native_fn = native_fn
                a0, a1 = min(t[False]), min(t[True])
                print(f"{qtype:7s} {n:6d}x{k:<5d} m={m:<4d} numpy {a0:8.3f} ms  native {a1:8.3f} ms  x{a0 / a1:5.1f}",
                      flush=True)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
