"""GPU time of layer_norm on webgpu: ``layer_norm_rows.wgsl`` (new: each row read once into
registers, several rows a workgroup) against ``layer_norm.wgsl`` (old: a workgroup per row, the
row read three times; what ``EMBER_WEBGPU_LN_ROWS=0`` runs), float32 rows of (rows, D) with
random weights and biases, for (4096, 384), (512, 384), (16, 384) (MiniLM's layer_norms at a
batch of 32 x 128, 4 x 128 and 16 tokens) and (4096, 4096).

    .venv/bin/python tests/bench/bench_layer_norm_gpu.py
    .venv/bin/python tests/bench/bench_layer_norm_gpu.py --shapes 4096x384,4096x768 --reps 200 --rounds 7

Each kernel is compiled into a plan (``ember.compile``) of the one dispatch, checked against a
float64 numpy layer_norm, then timed in ``--rounds`` rounds, the two kernels in a random order
each round; the medians over rounds are printed. Where the adapter has ``timestamp-query``
(``PassTimer``): "own pass" is the median GPU time of the dispatch replayed ``--reps`` times,
each in a compute pass of its own between timestamps (as a profile of a model's stream reports
it), and "batched" the GPU time of ``--reps`` calls of the plan recorded back to back (summed
pass timestamps / reps). "wall" is the time of those calls from the first record to the end of
``ember.webgpu.synchronize``, per call. GB/s counts x read and the output written once each
(8 bytes an element) plus the weight and bias (8 bytes per column): the traffic the kernel
cannot avoid, to hold against the memory's bandwidth (H100 SXM: 3.35 TB/s).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np


def _ref(x, w, b, eps):
    x = x.astype(np.float64)
    d = x - x.mean(-1, keepdims=True)
    return d / np.sqrt((d * d).mean(-1, keepdims=True) + eps) * w + b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x384,512x384,16x384,4096x4096")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    import ember
    import ember.webgpu as wg
    from ember.webgpu import nn
    from ember.webgpu.native import PassTimer

    rt = wg.get_runtime()
    timer = PassTimer.install(rt)
    info = wg.info()
    print(f"{info.get('device')} ({info.get('backend')}, {info.get('adapter_type')}); features "
          f"{sorted(rt.features)}; timer {'GPU timestamps' if timer else 'none (wall only)'}; "
          f"{a.reps} reps, median of {a.rounds} rounds")
    kernels = {"new": True, "old": False}
    rng = np.random.default_rng(0)
    rnd = random.Random(0)
    eps = 1e-5
    print(f"{'shape':>12s} {'kernel':>6s} {'lanes':>16s} {'own pass us':>12s} {'GB/s':>7s} "
          f"{'batched us':>11s} {'GB/s':>7s} {'wall us':>9s} {'max err':>9s} dispatches")
    for spec in a.shapes.split(","):
        rows, D = (int(v) for v in spec.lower().split("x"))
        xn = rng.standard_normal((rows, D)).astype(np.float32) * 2 + 0.5
        wn = (rng.standard_normal(D) * 0.5 + 1).astype(np.float32)
        bn = rng.standard_normal(D).astype(np.float32)
        x, w, b = (ember.from_numpy(v, device="webgpu") for v in (xn, wn, bn))
        nbytes = rows * D * 8 + D * 8
        want = _ref(xn, wn, bn, eps)
        steps, cmds, errs = {}, {}, {}
        for k, on in kernels.items():
            nn.LN_ROWS = on
            steps[k] = ember.compile(lambda x, w, b: ember.layer_norm(x, (D,), w, b, eps=eps))
            errs[k] = float(np.abs(steps[k](x, w, b).numpy() - want).max())
            steps[k](x, w, b).numpy()                       # the second call records the plan
            plan = steps[k].plan_for(x, w, b)
            stream = getattr(getattr(plan, "fast", None), "stream", None)
            cmds[k] = stream.cmds if stream is not None else None
        res = {k: [] for k in kernels}
        for _ in range(a.rounds):
            order = list(kernels)
            rnd.shuffle(order)
            for k in order:
                nn.LN_ROWS = kernels[k]
                own = float("nan")
                if timer and cmds[k]:
                    d = timer.each(cmds[k] * a.reps)             # the plan's dispatches, summed per call
                    n = len(cmds[k])
                    own = statistics.median(sum(d[i:i + n]) for i in range(0, len(d), n))
                if timer:
                    timer.start()
                wg.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.reps):
                    y = steps[k](x, w, b)
                wg.evaluate(y)
                wg.synchronize()
                wall = (time.perf_counter() - t0) / a.reps
                gpu = timer.seconds() if timer else None
                res[k].append((own, gpu / a.reps if gpu else float("nan"), wall))
        nn.LN_ROWS = True
        for k in kernels:
            own, bat, wall = (statistics.median(r[i] for r in res[k]) for i in range(3))
            shape = nn.ln_rows_shape(D) if kernels[k] else None
            lanes = f"{shape[1]}x{shape[2]}{'v4' if shape[0] else ''}/wg{shape[3]}" if shape else "wg/row"
            gbs = lambda s: nbytes / s / 1e9 if s == s and s > 0 else float("nan")   # noqa: E731
            print(f"{spec:>12s} {k:>6s} {lanes:>16s} {own * 1e6:12.2f} {gbs(own):7.1f} {bat * 1e6:11.2f} "
                  f"{gbs(bat):7.1f} {wall * 1e6:9.1f} {errs[k]:9.1e} {len(cmds[k] or ())}")


if __name__ == "__main__":
    main()
