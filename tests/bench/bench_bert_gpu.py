"""BERT inference on a GPU (issue 20's inference row): a MiniLM-shaped BERT (6 layers, 384 wide, 12
heads; random weights, bench_models' ONNX graph) imported with ``ember.onnx.load(device="webgpu")``
(a compiled plan: one dispatch stream a call) next to PyTorch CUDA eager fp32 (TF32 off) on the same
weights and inputs. Per shape: median ms per call with the output read back to the host, ember's
host time per call (the replay's encode + submit, before the read waits), dispatches per call, and
the largest difference from PyTorch.

    python tests/bench/bench_bert_gpu.py [--shapes 8x64,32x128,1x16] [--reps 30] [--profile] [--variant V]

``--profile``: after each shape, the GPU time of every kernel of its replayed plan (each dispatch
in a pass of its own), summed per pipeline.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_models as M  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8x64,32x128,1x16", help="batch x tokens, comma separated")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="also the GPU time per kernel of each shape's plan")
    ap.add_argument("--variant", default=None, help="force this matmul variant where eligible (tiled, rb32, rb64, rb128, sk, sg)")
    a = ap.parse_args()
    import ember
    import ember.onnx
    from ember.webgpu.runtime import get_runtime

    if a.variant:
        from ember.webgpu import autotune

        autotune.force("matmul", a.variant)
    c = M.MINILM
    w = M.random_bert_weights(c)
    model = ember.onnx.load(M.bert_onnx(c, w), device="webgpu")
    rt = get_runtime()
    print(f"adapter: {rt.driver.info.get('device')} ({rt.driver.info.get('backend')}); ember.onnx.load, compiled")
    torch = None
    try:
        import torch
        if not torch.cuda.is_available():
            torch = None
    except ImportError:
        pass
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        fwd = M.bert_torch(c, w, device="cuda")
    print(f"{'shape':>8} {'ember ms':>9} {'host ms':>8} {'disp':>5} {'torch ms':>9} {'ratio':>6} {'max diff':>9}")
    for shape in a.shapes.split(","):
        b, n = (int(v) for v in shape.split("x"))
        ids, mask = M.bert_inputs(c, b, n)
        feeds = {"input_ids": ids, "attention_mask": mask}

        def call():
            out = model.run(feeds)
            return next(iter(out.values()))
        for _ in range(3):
            got = call().numpy()
        ts, hs = [], []
        for _ in range(a.reps):
            rt.reset_stats()
            t0 = time.perf_counter()
            y = call()
            t1 = time.perf_counter()
            y.numpy()
            ts.append(time.perf_counter() - t0)
            hs.append(t1 - t0)
        disp = rt.stats.get("dispatches", 0)
        em = 1e3 * float(np.median(ts))
        line = f"{shape:>8} {em:9.2f} {1e3 * float(np.median(hs)):8.2f} {disp:5d}"
        if torch is not None:
            ti, tm = torch.from_numpy(ids).cuda(), torch.from_numpy(mask).cuda()
            with torch.no_grad():
                for _ in range(3):
                    ref = fwd(ti, tm).cpu().numpy()
                tt = []
                for _ in range(a.reps):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fwd(ti, tm).cpu()
                    tt.append(time.perf_counter() - t0)
            tms = 1e3 * float(np.median(tt))
            line += f" {tms:9.2f} {em / tms:6.2f} {float(np.abs(got - ref).max()):9.2e}"
        print(line)
        if a.profile:
            from bench_webgpu import PassTimer, print_stream_profile

            plans = [p for p in model._compiled.plans.values() if getattr(getattr(p, "fast", None), "stream", None)]
            if plans:
                timer = PassTimer.install(rt)
                print_stream_profile(rt, plans[-1].fast.stream, timer)
                rt.driver.timer = None
            else:
                print("  (no dispatch stream for this shape's plan)")


if __name__ == "__main__":
    main()
