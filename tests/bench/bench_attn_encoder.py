"""GPU time of encoder-style scaled_dot_product_attention on webgpu (many query rows per head, a
BERT additive padding mask (B, 1, 1, S)): the tiled kernel (attention_tiled.wgsl), the per-row
kernel (attention.wgsl, EMBER_WEBGPU_ATTN_TILED=0) and the op's composite (scores matmul,
softmax, context matmul: what an imported BERT ran before its attention was fused), for
MiniLM-shaped heads (12 heads of 32) at a few batch x sequence sizes. Prints microseconds per
call: GPU (PassTimer: timestamps around every pass the calls submitted, summed) and wall (submit
+ wait, recording included), medians of ``--rounds`` rounds whose settings run in a random order.

    python tests/bench/bench_attn_encoder.py
    python tests/bench/bench_attn_encoder.py --shapes 32x12x128x32 --mask bool --layout qkv
    EMBER_WEBGPU_ATTN_TILE=16x32 python tests/bench/bench_attn_encoder.py    # force a tile

``--layout qkv``: q, k, v are views into one (B, L, 3 H E) tensor (a fused QKV projection,
split into heads and permuted), read in place through their strides; ``dense``: contiguous
(B, H, L, E) tensors.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

import numpy as np

MODES = ("tiled", "rows", "composite")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="32x12x128x32,8x12x64x32,1x12x16x32", help="BxHxLxE, comma-separated")
    ap.add_argument("--mask", choices=("add", "bool", "none"), default="add")
    ap.add_argument("--layout", choices=("dense", "qkv"), default="dense")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--reps", type=int, default=50, help="calls per timing")
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    import ember
    import ember.webgpu as wg
    from ember.registry import OPS
    from ember.webgpu import nn
    from ember.webgpu.native import PassTimer

    rt = wg.get_runtime()
    timer = PassTimer.install(rt)
    info = wg.info()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    print(f"{info.get('device')} ({info.get('backend')}, {info.get('adapter_type')}); mask {a.mask}, "
          f"layout {a.layout}, {a.reps} calls a timing, median of {a.rounds} rounds; "
          f"timer {'GPU timestamps' if timer else 'none (wall only)'}")
    rng = np.random.default_rng(0)
    g = lambda x: ember.from_numpy(np.ascontiguousarray(x, np.float32), device="webgpu")   # noqa: E731

    def run(mode, q, k, v, m, scale):
        if mode == "composite":
            args = (q, k, v) if m is None else (q, k, v, m)
            out = OPS["scaled_dot_product_attention"].decompose(*args, is_causal=False, scale=scale)
            wg.evaluate(out)
            return out
        os.environ["EMBER_WEBGPU_ATTN_TILED"] = "0" if mode == "rows" else "1"
        return ember.scaled_dot_product_attention(q, k, v, m, scale=scale) if m is not None else \
            ember.scaled_dot_product_attention(q, k, v, scale=scale)

    print(f"{'shape':<18s}{'tile':>8s}" + "".join(f"{'us ' + m + ' GPU (wall)':>28s}" for m in modes))
    for spec in a.shapes.split(","):
        B, H, L, E = (int(x) for x in spec.lower().split("x"))
        if a.layout == "qkv":
            x = g(rng.standard_normal((B, L, 3 * H * E)))
            q, k, v = (x[:, :, i * H * E:(i + 1) * H * E].reshape((B, L, H, E)).permute_dims((0, 2, 1, 3))
                       for i in range(3))
        else:
            q, k, v = (g(rng.standard_normal((B, H, L, E))) for _ in range(3))
        m = None
        if a.mask != "none":
            keep = np.ones((B, 1, 1, L), bool)
            for b in range(B):                      # padded sequences: the last tokens masked
                keep[b, ..., L - (b * 7) % max(L // 2, 1):] = False
            keep[..., 0] = True
            m = ember.from_numpy(keep, device="webgpu") if a.mask == "bool" else \
                g(np.where(keep, 0.0, -10000.0))
        scale = 1.0 / math.sqrt(E)
        os.environ.pop("EMBER_WEBGPU_ATTN_TILED", None)
        tile = nn.attn_tile(rt, (B, H, L, E), E, L)
        for mode in modes:                          # pipelines built, results compared
            ref = run(modes[0], q, k, v, m, scale).numpy()
            got = run(mode, q, k, v, m, scale).numpy()
            err = float(np.abs(got - ref).max())
            if err > 1e-4:
                print(f"  {spec} {mode}: max |difference| from {modes[0]} {err:.3g}")
        res = {mode: [] for mode in modes}
        rnd = random.Random(0)
        for _ in range(a.rounds):
            order = modes[:]
            rnd.shuffle(order)
            for mode in order:
                wg.synchronize()
                if timer:
                    timer.start()
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    out = run(mode, q, k, v, m, scale)
                wg.evaluate(out)
                wg.synchronize()
                wall = (time.perf_counter() - t0) / a.reps * 1e6
                gpu = timer.seconds() if timer else None
                res[mode].append((gpu / a.reps * 1e6 if gpu else float("nan"), wall))
        os.environ.pop("EMBER_WEBGPU_ATTN_TILED", None)
        cells = [f"{statistics.median(x[0] for x in res[mo]):10.1f} ({statistics.median(x[1] for x in res[mo]):8.1f})"
                 for mo in modes]
        tl = f"{tile[0]}x{tile[1]}" if tile else "rows"
        print(f"{spec:<18s}{tl:>8s}" + "".join(f"{c:>28s}" for c in cells))


if __name__ == "__main__":
    main()
