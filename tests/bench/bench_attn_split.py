"""GPU time of a decode step's attention on webgpu, split over positions or not
(``EMBER_ATTN_SPLIT``, ``ember.webgpu.quant.attn_splits``): SmolLM2-135M's shape (9 query / 3
key-value heads of 64, a cache of ``--context`` rows), ``--layers`` attention calls chained in
one compiled plan (each layer's output is the next layer's q, each layer its own caches, as the
dependent dispatches of a decode step), replayed ``--reps`` times at each position. Prints GPU
microseconds per layer (PassTimer: timestamps around every pass the replays submitted) and wall
microseconds per layer, the median of ``--rounds`` rounds whose settings run in a random order.

    python tests/bench/bench_attn_split.py                              # attention_cached
    python tests/bench/bench_attn_split.py --proj                       # attention_proj (+ the sum of its rows)
    python tests/bench/bench_attn_split.py --splits 0,auto,8,16,28,56 --pos 16,64,150,300,600,1000

``auto`` is the rule a GPU gets (on a CPU adapter, lavapipe, it is taken as if the adapter were a
GPU: the rule itself leaves CPUs unsplit). ``--proj`` multiplies by a random q4_1 576 x 576
output weight (attention_proj, its (1 + Hq, 1, n) rows then summed and reshaped into the next
q: one more fused dispatch a layer, in every setting alike).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--splits", default="0,auto,8,16,28,56")
    ap.add_argument("--pos", default="16,64,150,300,600,1000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--proj", action="store_true")
    a = ap.parse_args()
    import ember
    import ember.webgpu as wg
    from ember.ops.llm import attention_proj
    from ember.quant import QTensor
    from ember.webgpu import quant as wq
    from ember.webgpu.native import PassTimer

    rt = wg.get_runtime()
    wq._cpu_adapter = lambda rt: False        # ("auto": the rule as on a GPU)
    Hq, Hkv, D, C, L = 9, 3, 64, a.context, a.layers
    rng = np.random.default_rng(0)
    g = lambda x: ember.from_numpy(np.ascontiguousarray(x, np.float32), device="webgpu")   # noqa: E731
    kcs = [g(rng.standard_normal((C, Hkv, D))) for _ in range(L)]
    vcs = [g(rng.standard_normal((C, Hkv, D))) for _ in range(L)]
    q, k, v = (g(rng.standard_normal(s)) for s in ((1, Hq, D), (1, Hkv, D), (1, Hkv, D)))
    if a.proj:
        w = QTensor.quantize(ember.from_numpy(rng.standard_normal((Hq * D, Hq * D)).astype(np.float32) * 0.05,
                                              device="python"), "q4_1").to("webgpu")
        r = g(np.zeros((1, Hq * D)))

    def layers(x, k, v, pos):
        for i in range(L):
            if a.proj:
                x = ember.sum(attention_proj(x, k, v, kcs[i], vcs[i], pos, w, r), axis=0).reshape((1, Hq, D))
            else:
                x = ember.attention_cached(x, k, v, kcs[i], vcs[i], pos)
        return x

    def setting(s):
        if s == "auto":
            os.environ.pop("EMBER_ATTN_SPLIT", None)
        else:
            os.environ["EMBER_ATTN_SPLIT"] = s

    splits = [s.strip() for s in a.splits.split(",") if s.strip()]
    positions = [int(p) for p in a.pos.split(",") if p.strip() and int(p) < C]
    steps = {}
    for s in splits:
        setting(s)
        steps[s] = ember.compile(layers)
    timer = PassTimer.install(rt)
    info = wg.info()
    os.environ.pop("EMBER_ATTN_SPLIT", None)
    print(f"{info.get('device')} ({info.get('backend')}, {info.get('adapter_type')}); {L} layers, C = {C}, "
          f"{'attention_proj' if a.proj else 'attention_cached'}; rule: S = {wq.attn_splits(1, Hq, C)}; "
          f"timer {'GPU timestamps' if timer else 'none (wall only)'}")
    res = {}
    rnd = random.Random(0)
    for p in positions:
        pos = ember.tensor([p], dtype="int32", device="webgpu")
        for s in splits:                        # record / warm each setting at this position
            setting(s)
            steps[s](q, k, v, pos).numpy()
        for _ in range(a.rounds):
            order = splits[:]
            rnd.shuffle(order)
            for s in order:
                setting(s)
                if timer:
                    timer.start()
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    out = steps[s](q, k, v, pos)
                wg.evaluate(out)
                wg.synchronize()
                wall = (time.perf_counter() - t0) / a.reps / L * 1e6
                gpu = timer.seconds() if timer else None
                res.setdefault((p, s), []).append((gpu / a.reps / L * 1e6 if gpu else float("nan"), wall))
    disp = {}
    for s in splits:
        setting(s)
        plan = steps[s].plan_for(q, k, v, ember.tensor([0], dtype="int32", device="webgpu"))
        disp[s] = plan.fast.describe()["dispatches"] if plan.fast is not None else "?"
    os.environ.pop("EMBER_ATTN_SPLIT", None)
    print("us per layer, GPU (wall), medians; dispatches per step: "
          + ", ".join(f"{s}: {disp[s]}" for s in splits))
    print("pos    " + "".join(f"{'S=' + s:>20s}" for s in splits))
    for p in positions:
        cells = []
        for s in splits:
            xs = res[(p, s)]
            cells.append(f"{statistics.median(x[0] for x in xs):8.2f} ({statistics.median(x[1] for x in xs):8.1f})")
        print(f"{p:<7d}" + "".join(f"{c:>20s}" for c in cells))


if __name__ == "__main__":
    main()
