"""Quantized linear layers on the numpy device: ms per ``quant.linear`` call for the SmolLM2-135M
shapes (Q4_1 1536x576 and 576x1536 layer weights, the Q8_0 49152x576 tied embedding as the
output head), decoding (1..16 rows of x) and prompts (64..256 rows), beside a float32 matmul of
the same weight expanded (what the weight would cost kept as float: 4-8x the memory).

    python tests/bench/bench_quant.py [--rows 1,4,16,64,256] [--reps N] [--threads T]

Weights are random valid blocks (no file needed). Figures are the best of ``--reps`` calls.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import ember
from ember import quant

SHAPES = (("q4_1", 1536, 576), ("q4_1", 576, 1536), ("q8_0", 49152, 576))


def random_weight(qtype: str, n: int, k: int, rng) -> quant.QTensor:
    f = quant.FORMATS[qtype]
    raw = rng.integers(0, 256, size=(n * k // f.block, f.nbytes), dtype=np.uint8)
    raw[:, :2] = rng.uniform(0.001, 0.02, size=(len(raw), 1)).astype(np.float16).view(np.uint8)
    if qtype == "q4_1":
        raw[:, 2:4] = (-rng.uniform(0.001, 0.02, size=(len(raw), 1))).astype(np.float16).view(np.uint8)
    return quant.QTensor.from_bytes(raw.tobytes(), qtype, (n, k), device="numpy")


def best_ms(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,16,64,256")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, help="worker threads for one qlinear (default: the cores, at most 4)")
    a = ap.parse_args(argv)
    from ember.backends import numpy_quant

    if a.threads:
        numpy_quant.THREADS = a.threads
    ember.get_backend("numpy")
    rng = np.random.default_rng(0)
    print(f"numpy {np.__version__}, qlinear threads {numpy_quant.THREADS}")
    print(f"{'weight':>20} {'rows':>5} {'qlinear ms':>11} {'float ms':>9} {'ns/weight':>10}")
    for qtype, n, k in SHAPES:
        w = random_weight(qtype, n, k, rng)
        dense = w.dequantize().numpy()
        reps = a.reps if n * k < 4_000_000 else max(3, a.reps // 5)
        for m in (int(r) for r in a.rows.split(",")):
            x = ember.from_numpy(rng.normal(size=(m, k)).astype(np.float32), device="numpy")
            q_ms = best_ms(lambda: quant.linear(x, w), reps)
            f_ms = best_ms(lambda: x._buf @ dense.T, reps)
            print(f"{qtype + ' ' + str(n) + 'x' + str(k):>20} {m:>5} {q_ms:>11.3f} {f_ms:>9.3f} "
                  f"{q_ms * 1e6 / (n * k):>10.2f}", flush=True)


if __name__ == "__main__":
    main()
