"""WebGPU benchmark: ember's matmul kernel variants next to numpy and PyTorch, and the fused GELU
chain next to the same chain unfused, in one run. Prints tables of GFLOP/s (or ms) and ratios.

    python build.py bench webgpu                 # or: .venv/bin/python tests/bench/bench_webgpu.py
    .venv/bin/python tests/bench/bench_webgpu.py --sizes 1024,2048,4096 --gelu 16777216   # a real GPU

Matmul: square float32 n x n @ n x n for each size, every autotune variant forced in turn
(``tiled``, ``rb32``, ``rb64``, ``rb128``, ``sk``; ``sg`` only where the adapter has subgroups and the rows are
few), then the variant autotune picks, numpy (its BLAS, all threads), PyTorch on the CPU and, where
PyTorch sees CUDA, PyTorch on the GPU with TF32 off (the same-GPU peer). A batch-1 linear layer
``x(1, K) @ W.T`` (K = N = the largest size) shows the few-rows case.

On a CPU adapter (lavapipe, SwiftShader) the default sizes stop at 1024: one 2048^3 product
takes seconds per variant there (the 16x16 ``tiled`` one about a minute), which says nothing more.

Quantized linear layers (``--qlinear``: that section alone): ``qlinear`` of GGUF-block weights
(q4_1, q8_0 by default) at 4096x4096 and SmolLM2's 576x1536 / 1536x576: batch-1 decode (the
matrix-vector kernel, reported as GB/s of weight read: the figure to hold against the GPU's HBM
bandwidth) with every thread layout forced in turn, and a 128-row prompt (the tiled kernel,
GFLOP/s; on a GPU also the scalar-tile kernel and dequantize + the autotuned float matmul); next to an fp32 batch-1 linear of the same shape (ember) and PyTorch's fp16 one on
CUDA; then the 211 products of one SmolLM2-135M decode token (30 layers of q4_1, the q8_0 head)
on distinct weights. The weights cycle through enough copies to pass the GPU's L2 cache, and the
calls of one timing go into one compute pass timed by GPU timestamps, each into its own output.

    .venv/bin/python tests/bench/bench_webgpu.py --qlinear                      # 4096^2, 576x1536, 1536x576
    .venv/bin/python tests/bench/bench_webgpu.py --qlinear --qtypes q4_1,q8_0,q4_k,q6_k --peak-gbs 4800

Every timing runs the op once (pipeline compile, autotune), then records it ``reps`` times and
times the submit and the wait (``ember.webgpu.synchronize``): GPU throughput, not per-call latency;
on a GPU the best of three such runs. GPU times are the timestamps of EVERY pass the timing
submitted, summed (``PassTimer``), each checked against the wall time of the span that recorded,
submitted and waited for them; every figure is checked against the device's fp32 and memory
peaks (known for H100/H200, else ``--peak-tflops``/``--peak-gbs``). A figure that fails a check
is printed with ``BENCHMARK FAILURE`` and listed at the end.

``--f16``: float16 matmul at the same sizes (that section alone): ember float16 in half storage
(``f16`` operands and result, where the adapter has ``shader-f16``) with the ``rbh`` variant forced
(f16 multiply-adds, f16 sums over k tiles of 16 added into f32), autotuned (rbh among the
candidates; the variant it chose is printed) and autotuned with f32 math only
(``EMBER_WEBGPU_F16_MATH=0``), ember float16 in the 4-byte form (``set_f16(False)``), ember
float32, and PyTorch fp16 (``torch.matmul`` on CUDA half tensors) where PyTorch sees CUDA; then the
batch-1 linear ``x(1, K) @ W.T`` in float16 and float32 (the weight read is half the bytes in half
storage).

    .venv/bin/python tests/bench/bench_webgpu.py --f16                          # lavapipe: 256,512,1024
    .venv/bin/python tests/bench/bench_webgpu.py --f16 --sizes 1024,2048,4096   # a real GPU

``--replay``: host time of a replayed plan per dispatch, step by step against the prebuilt
dispatch stream (``ember.webgpu.replay``), and the stream's encoding loop alone. ``auto_e2e`` also counts the Python that records each call
(ember records a batch, then submits it, so that time adds up rather than overlapping the GPU's).
Each variant's result is checked against numpy before it is timed.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

import ember
import ember.webgpu as wg
from ember.webgpu import autotune, linalg
from ember.webgpu.native import PassTimer  # noqa: F401  (GPU timestamps of every pass; h200_profile, bench_train use it from here)


def _arg_list(s):
    return [int(v) for v in s.split(",") if v]


TRIALS = [1]


def timed(fn, reps: int, sync) -> float:
    # (ember's webgpu ops are lazy: the functions timed here call ember.webgpu.evaluate)
    """Seconds per call: one warm-up call, then ``reps`` calls and one wait; the best of
    ``TRIALS[0]`` such runs (3 on a GPU, whose clocks and neighbours make single runs noisy)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(TRIALS[0]):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def print_stream_profile(rt, stream, timer) -> None:
    """GPU time of each kernel of a compiled plan's dispatch stream (``plan.fast.stream``): every
    dispatch replayed in a pass of its own between GPU timestamps (third of three rounds), summed
    per pipeline and printed, largest first."""
    names = {id(v): repr(k)[:110] for k, v in rt.pipelines.items()}
    per = {}
    for rep in range(3):
        d = timer.each(stream.cmds)
        if rep == 2:
            for (pipe, bg, grid), sec in zip(stream.cmds, d):
                c = per.setdefault((names.get(id(pipe), "?"), tuple(grid)), [0, 0.0, grid])
                c[0] += 1
                c[1] += sec * 1e6
    total = sum(v[1] for v in per.values())
    print(f"GPU time per kernel, each dispatch in its own pass ({len(stream.cmds)} dispatches, {total:.0f} us in all):")
    for k, (n, us, grid) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {us:9.1f} us  {n:4d} x {us / n:7.2f} us  grid {grid}  {k[0]}")


# ---- honesty checks: a figure above the device's peak, or GPU time longer than the wall time
# that contained it, is a failure of the benchmark (printed, and counted at the end)

PEAKS = {"H200": (67.0, 4800.0), "H100": (67.0, 3350.0)}   # fp32 non-tensor TFLOP/s, HBM GB/s
PEAK = {"tflops": None, "gbs": None}
FAILURES: list = []


def set_peaks(info, tflops=None, gbs=None) -> None:
    name = f"{info.get('device', '')} {info.get('description', '')}"
    for key, (tf, bw) in PEAKS.items():
        if key in name:
            PEAK["tflops"], PEAK["gbs"] = tf, bw
    if tflops:
        PEAK["tflops"] = tflops
    if gbs:
        PEAK["gbs"] = gbs


def check_rate(what: str, flop=None, nbytes=None, seconds=None) -> str:
    """'' or a FAILED note when ``flop``/``nbytes`` in ``seconds`` pass the device's peak."""
    notes = []
    if seconds is None or seconds <= 0:
        notes.append("no time")
    else:
        if flop and PEAK["tflops"] and flop / seconds / 1e12 > PEAK["tflops"]:
            notes.append(f"{flop / seconds / 1e12:.1f} TFLOP/s > peak {PEAK['tflops']:.0f}")
        if nbytes and PEAK["gbs"] and nbytes / seconds / 1e9 > PEAK["gbs"]:
            notes.append(f"{nbytes / seconds / 1e9:.0f} GB/s > peak {PEAK['gbs']:.0f}")
    if notes:
        FAILURES.append(f"{what}: " + "; ".join(notes))
        return " [BENCHMARK FAILURE: " + "; ".join(notes) + "]"
    return ""


def _gpu_vs_wall(what: str, gpu_s, wall_s) -> float:
    """The GPU time, cross-checked: summed pass time can never exceed the wall time of the span
    that recorded, submitted and waited for those passes."""
    if gpu_s is None:
        FAILURES.append(f"{what}: timestamp query set overflowed; wall time used")
        return wall_s
    if gpu_s > wall_s * 1.05 + 1e-5:
        FAILURES.append(f"{what}: GPU time {gpu_s * 1e3:.3f} ms > wall {wall_s * 1e3:.3f} ms")
    return gpu_s


TIMER = [None]
BUSY = [None]


def keep_busy(rt):
    """``busy()`` submits ~30 ms of unrelated GPU work (8 rb128 4096^3 products): submitted just
    before a timed burst is recorded, it keeps the GPU's clocks up until the burst starts (a GPU
    idling while Python records drops its clocks, seen as 15 against 23 TFLOP/s at n=1024)."""
    x = ember.from_numpy(np.full((4096, 4096), 1e-3, np.float32), device="webgpu")

    def busy():
        old = autotune.forced("matmul")
        autotune.force("matmul", "rb128")
        try:
            for _ in range(8):
                wg.evaluate(x @ x)
        finally:
            autotune.force("matmul", old)
        rt.driver.flush()
    return busy


def gpu_timed(fn, reps: int) -> float:
    """Seconds of GPU work per call, best of ``TRIALS[0]``: ``reps`` calls are recorded (ember
    submits recorded work at ``synchronize``), then timed by GPU timestamps around their pass
    where the adapter has them, else by the wall clock of the submit and the wait. Either way
    the Python that records a dispatch (~0.1 ms, the same for every variant) is left out."""
    fn()
    wg.synchronize()
    timer = TIMER[0]
    best = float("inf")
    for _ in range(TRIALS[0]):
        if BUSY[0] is not None:
            BUSY[0]()
        t_all = time.perf_counter()
        if timer is not None:
            timer.start()
        for _ in range(reps):
            fn()
        t0 = time.perf_counter()
        wg.synchronize()
        t1 = time.perf_counter()
        dt = t1 - t0
        if timer is not None:
            dt = _gpu_vs_wall(getattr(fn, "__qualname__", "a timing"), timer.seconds(), t1 - t_all)
        best = min(best, dt / reps)
    return best


def reps_for(seconds_one: float, budget: float) -> int:
    # at most 100: a split-K matmul is 2 dispatches, and the driver submits on its own at 256
    return max(2, min(100, int(budget / max(seconds_one, 1e-6))))


def matmul_table(sizes, budget, cpu_adapter, cpu_peers=True):
    rng = np.random.default_rng(0)
    rt = wg.get_runtime()
    try:
        import torch
        torch.set_grad_enabled(False)
    except ImportError:
        torch = None
    cuda = torch is not None and torch.cuda.is_available()
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    rows = []
    for n in sizes:
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        ref = a[:64].astype(np.float64) @ b.astype(np.float64)
        ta = ember.from_numpy(a, device="webgpu")
        tb = ember.from_numpy(b, device="webgpu")
        flop = 2.0 * n ** 3
        row = {"n": n}
        for v in linalg.VARIANTS:
            if not linalg.eligible(rt, v, n, n, n, "f32"):
                continue
            if cpu_adapter and v == "tiled" and n > 1024:
                row[v] = None   # ~a minute per call on a CPU adapter
                continue
            autotune.force("matmul", v)
            out = (ta @ tb).numpy()
            err = float(np.abs(out[:64] - ref).max() / np.abs(ref).max())
            if err > 1e-4:
                raise SystemExit(f"matmul variant {v} at n={n}: relative error {err:.2e}")
            one = gpu_timed(lambda: wg.evaluate(ta @ tb), 1)
            dt = gpu_timed(lambda: wg.evaluate(ta @ tb), reps_for(one, budget))
            row[v] = flop / dt / 1e9
            row.setdefault("fail", "")
            row["fail"] += check_rate(f"matmul {v} n={n}", flop=flop, nbytes=12.0 * n * n, seconds=dt)
        autotune.force("matmul", None)
        t0 = time.perf_counter()
        wg.evaluate(ta @ tb)
        wg.synchronize()
        row["autotune_s"] = time.perf_counter() - t0
        key = linalg.plan_key("f32", n, n, n, bare=len(linalg.bare_variants(n, n, n, "f32")))
        row["chosen"] = autotune._table(rt).get(key, linalg.default_variant(rt, n, n, n, "f32"))
        one = gpu_timed(lambda: wg.evaluate(ta @ tb), 1)
        reps = reps_for(one, budget)
        dt = gpu_timed(lambda: wg.evaluate(ta @ tb), reps)
        row["auto"] = flop / dt / 1e9
        # end to end: recording included, not overlapped with the GPU (ember records a batch,
        # then submits it)
        dte = timed(lambda: wg.evaluate(ta @ tb), reps, wg.synchronize)
        row["auto_e2e"] = flop / dte / 1e9
        row.setdefault("fail", "")
        row["fail"] += check_rate(f"matmul auto n={n}", flop=flop, seconds=dt)
        row["fail"] += check_rate(f"matmul auto e2e n={n}", flop=flop, seconds=dte)
        if dte < dt * 0.8:   # (two separate timings: noise allowed, not a 20% contradiction)
            FAILURES.append(f"matmul n={n}: end-to-end {dte * 1e3:.3f} ms per call < GPU time {dt * 1e3:.3f} ms")
            row["fail"] += " [BENCHMARK FAILURE: end to end faster than the GPU time]"
        if cpu_peers:
            one = timed(lambda: a @ b, 1, lambda: None)
            row["numpy"] = flop / timed(lambda: a @ b, reps_for(one, budget), lambda: None) / 1e9
        if torch is not None:
            xa, xb = torch.from_numpy(a), torch.from_numpy(b)
            if cpu_peers:
                one = timed(lambda: xa @ xb, 1, lambda: None)
                row["torch_cpu"] = flop / timed(lambda: xa @ xb, reps_for(one, budget), lambda: None) / 1e9
            if cuda:
                ga, gb = xa.cuda(), xb.cuda()
                dtc = timed(lambda: ga @ gb, 20, torch.cuda.synchronize)
                row["torch_cuda"] = flop / dtc / 1e9
                row["fail"] += check_rate(f"torch cuda matmul n={n}", flop=flop, seconds=dtc)
        rows.append(row)
        del ta, tb
    return rows


def linear_row(k, budget):
    """Batch-1 linear layer: x (1, k) @ W.T with W (k, k) row-major (the transposed read); the
    ``mv`` column reads the same product with the weight stored (k_in, k_out) (x @ W.T copied)."""
    rng = np.random.default_rng(1)
    rt = wg.get_runtime()
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = rng.standard_normal((k, k)).astype(np.float32)
    tx = ember.from_numpy(x, device="webgpu")
    tw_t = ember.from_numpy(w, device="webgpu").permute_dims((1, 0))
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    row = {"k": k}
    flop = 2.0 * k * k
    t_kn = ember.from_numpy(np.ascontiguousarray(w.T), device="webgpu")
    for v in linalg.VARIANTS:
        if not linalg.eligible(rt, v, 1, k, k, "f32"):
            continue
        autotune.force("matmul", v)
        tw = t_kn if v == "mv" else tw_t
        out = (tx @ tw).numpy()
        err = float(np.abs(out - ref).max() / np.abs(ref).max())
        if err > 1e-4:
            raise SystemExit(f"linear variant {v}: relative error {err:.2e}")
        one = gpu_timed(lambda: wg.evaluate(tx @ tw), 1)
        dt = gpu_timed(lambda: wg.evaluate(tx @ tw), reps_for(one, budget))
        row[v] = flop / dt / 1e9
        row[v + "_GBs"] = 4.0 * k * k / dt / 1e9
        row.setdefault("fail", "")
        row["fail"] += check_rate(f"batch-1 linear {v} k={k}", flop=flop, nbytes=4.0 * k * k, seconds=dt)
    autotune.force("matmul", None)
    row["numpy"] = flop / timed(lambda: x @ w.T, 20, lambda: None) / 1e9
    return row


def f16_rows(sizes, budget, cpu_adapter=False):
    """float16 matmul n x n @ n x n (half storage, the 4-byte form), float32, PyTorch fp16 on
    CUDA; GFLOP/s. Each ember result is checked against numpy first. The batch-1 linear cycles
    through copies of its weight past the L2 cache (a 4096^2 f16 weight, 32 MB, fits an H100's
    50 MB L2: one copy read 4,158 "GB/s", over the HBM's 3,350)."""
    rng = np.random.default_rng(3)
    try:
        import torch
        torch.set_grad_enabled(False)
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    half_ok = "shader-f16" in wg.info().get("features", [])
    rows = []
    for n in sizes:
        a = (rng.standard_normal((n, n)) * 0.5).astype(np.float16)
        b = (rng.standard_normal((n, n)) * 0.5).astype(np.float16)
        ref = a[:64].astype(np.float64) @ b.astype(np.float64)
        flop = 2.0 * n ** 3
        row = {"n": n}
        # (name, dtype, half storage, forced variant, EMBER_WEBGPU_F16_MATH)
        forms = [("f16_rbh", np.float16, True, "rbh", "1"), ("f16_half", np.float16, True, None, "1"),
                 ("f16_f32math", np.float16, True, None, "0"), ("f16_wide", np.float16, False, None, "1"),
                 ("f32", np.float32, False, None, "1")]
        env_old = os.environ.get("EMBER_WEBGPU_F16_MATH")
        forced_old = autotune.forced("matmul")
        for name, dt, half, force, f16_math in forms:
            if half and not half_ok:
                row[name] = None
                continue
            old = wg.set_f16(half)
            os.environ["EMBER_WEBGPU_F16_MATH"] = f16_math
            autotune.force("matmul", force)
            try:
                ta = ember.from_numpy(a.astype(dt), device="webgpu")
                tb = ember.from_numpy(b.astype(dt), device="webgpu")
                out = (ta @ tb).numpy()
                err = float(np.abs(out[:64].astype(np.float64) - ref).max() / np.abs(ref).max())
                # (rbh: f16 sums over a k tile of 16, about 2x the rounding of the result alone)
                if err > (4e-3 if name in ("f16_rbh", "f16_half") else 2e-3 if dt is np.float16 else 1e-4):
                    raise SystemExit(f"matmul {name} at n={n}: relative error {err:.2e}")
                one = gpu_timed(lambda: wg.evaluate(ta @ tb), 1)
                dt_s = gpu_timed(lambda: wg.evaluate(ta @ tb), reps_for(one, budget))
                row[name] = flop / dt_s / 1e9
                row.setdefault("fail", "")
                row["fail"] += check_rate(f"matmul {name} n={n}", flop=flop, seconds=dt_s)
                if name == "f16_half":     # the variant autotune chose (a float16 product has an epilogue)
                    from ember.registry import Meta
                    key = linalg.MatmulPlan(wg.get_runtime(), ta._buf, tb._buf, Meta((n, n), ember.float16)).key_epilogue
                    row["chose"] = autotune._table(wg.get_runtime()).get(key, "default")
            finally:
                wg.set_f16(old)
                autotune.force("matmul", forced_old)
                if env_old is None:
                    os.environ.pop("EMBER_WEBGPU_F16_MATH", None)
                else:
                    os.environ["EMBER_WEBGPU_F16_MATH"] = env_old
            del ta, tb
        if cuda:
            ga, gb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            dtc = timed(lambda: torch.matmul(ga, gb), 20, torch.cuda.synchronize)
            row["torch_cuda_fp16"] = flop / dtc / 1e9
        rows.append(row)
    k = max(sizes)
    x = rng.standard_normal((1, k)).astype(np.float16)
    w = (rng.standard_normal((k, k)) * 0.05).astype(np.float16)
    lin = {"k": k}
    for name, dt, half in (("f16_half", np.float16, True), ("f32", np.float32, False)):
        if half and not half_ok:
            continue
        old = wg.set_f16(half)
        try:
            tx = ember.from_numpy(x.astype(dt), device="webgpu")
            nb = (2 if half else 4) * k * k
            copies = 1 if cpu_adapter else min(64, max(1, -(-QL_PASS_BYTES // nb)))
            tws = [ember.from_numpy(w.astype(dt), device="webgpu").permute_dims((1, 0)) for _ in range(copies)]
            calls = [lambda w=tws[i % copies]: _evaluated(tx @ w) for i in range(3 if cpu_adapter else max(32, 2 * copies))]
            _one_pass_timed(calls, cpu_adapter)          # (compiles, warms)
            dt_s = _one_pass_timed(calls, cpu_adapter)
            lin[name] = (2.0 * k * k / dt_s / 1e9, nb / dt_s / 1e9)
            lin.setdefault("fail", "")
            lin["fail"] += check_rate(f"{name} batch-1 linear k={k}", flop=2.0 * k * k, nbytes=nb, seconds=dt_s)
            del tws
        finally:
            wg.set_f16(old)
    if cuda:
        gx = torch.from_numpy(x).cuda()
        gws = [torch.from_numpy(w).cuda() for _ in range(min(64, max(1, -(-QL_PASS_BYTES // (2 * k * k)))))]
        it = [0]

        def tcall():
            it[0] += 1
            return torch.matmul(gx, gws[it[0] % len(gws)].T)
        dtc = timed(tcall, 50, torch.cuda.synchronize)
        lin["torch_cuda_fp16"] = (2.0 * k * k / dtc / 1e9, 2.0 * k * k / dtc / 1e9)
    return rows, lin


def print_f16(rows, lin) -> None:
    cols = ["f16_rbh", "f16_half", "f16_f32math", "f16_wide", "f32", "torch_cuda_fp16"]
    cols = [c for c in cols if any(r.get(c) for r in rows)]
    print("\nmatmul float16 n x n @ n x n, GFLOP/s (higher is better): ember float16 in half storage with "
          "f16_rbh (rbh forced: f16 multiply-adds over k tiles of 16, f32 between tiles), f16_half (autotuned, rbh "
          "a candidate: 'chose'), f16_f32math (autotuned, EMBER_WEBGPU_F16_MATH=0: f32 accumulation only); "
          "f16_wide (4-byte form), f32 (float32), PyTorch fp16 on CUDA")
    print(f"{'n':>6} " + " ".join(f"{c:>16}" for c in cols) + "  rbh/f32 half/f32  chose")
    for r in rows:
        cells = [f"{'-' if r.get(c) is None else f'{r[c]:.1f}':>16}" for c in cols]
        ratios = [r[c] / r["f32"] if r.get(c) and r.get("f32") else float("nan") for c in ("f16_rbh", "f16_half")]
        print(f"{r['n']:>6} " + " ".join(cells) + f"  {ratios[0]:6.2f}x {ratios[1]:7.2f}x  {r.get('chose', '-')}"
              + r.get("fail", ""))
    print(f"batch-1 linear x(1, {lin['k']}) @ W.T, GFLOP/s (GB/s of weight read): "
          + ", ".join(f"{c} {lin[c][0]:.2f} ({lin[c][1]:.1f} GB/s)" for c in ("f16_half", "f32", "torch_cuda_fp16")
                      if c in lin) + lin.get("fail", ""))


def gelu_rows(n, budget):
    """x * ((x / sqrt(2)).erf() + 1) / 2 on n floats: fused (one kernel) vs one kernel per op."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal(n).astype(np.float32)
    x = ember.from_numpy(a, device="webgpu")
    s2 = math.sqrt(2.0)

    def chain():
        y = x * ((x / s2).erf() + 1) / 2
        wg.evaluate(y)
        return y

    from math import erf
    want = np.array([v * (erf(v / s2) + 1) / 2 for v in a[:1000].tolist()])
    out = {}
    for label, on in (("fused", True), ("unfused", False)):
        old = wg.set_fusion(on)
        try:
            got = chain().numpy()[:1000]
            if np.abs(got - want).max() > 1e-5:
                raise SystemExit(f"GELU chain ({label}) differs from the reference")
            wg.reset_stats()
            chain()
            wg.synchronize()
            dispatches = wg.stats()["dispatches"]
            one = timed(chain, 1, wg.synchronize)
            dt = timed(chain, reps_for(one, budget), wg.synchronize)
            out[label] = (dt, dispatches)
        finally:
            wg.set_fusion(old)
    return out


# ---- quantized linear (qlinear) -----------------------------------------------------------------

QL_SHAPES = ((4096, 4096), (576, 1536), (1536, 576))   # (n, k): out x in
QL_PASS_BYTES = 256 << 20   # weights cycled per timing: past a large L2 (the H200 has 50 MB)
QL_MIN_REPS = 64
# matrix-vector layouts swept at batch 1, named "<lanes>x<rows per group>u<items per step>" plus
# "i" (the items interleaved across the lanes, else a run of consecutive ones), "s" (x staged in
# workgroup memory) and "w<n>" (workgroups of n threads, else 256); --qlayouts picks some
# ("none": no sweep)
GEMV_LAYOUTS = ("16x1u4", "32x2u4", "32x1u1", "64x1u1", "32x1u4s", "64x1u4i", "16x1u4i", "8x2u4i", "8x2u4iw64",
                "8x2u4iw128", "8x1u4iw64", "4x2u4iw64", "8x4u4iw64", "16x2u4iw64", "8x2u8iw64", "8x2u4isw64")


def _layout_env(name: str) -> dict:
    """The EMBER_QLINEAR_* settings of a layout name such as "64x1u4i" or "8x2u4iw64" (see
    GEMV_LAYOUTS; "w<n>": workgroups of n threads, else 256)."""
    name, _, wgs = name.partition("w")
    lanes, rest = name.split("x")
    rb, rest = rest.split("u")
    u = rest.rstrip("is")
    return {"EMBER_QLINEAR_LANES": lanes, "EMBER_QLINEAR_RB": rb, "EMBER_QLINEAR_U": u, "EMBER_QLINEAR_WG": wgs or "256",
            "EMBER_QLINEAR_IL": "1" if "i" in rest else "0", "EMBER_QLINEAR_XSH": "1" if "s" in rest else "0"}


# where each block keeps its f16 scales (set to small values so the random blocks stay finite)
_SCALES = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}


def _ql_weight(qtype, n, k, rng):
    """(int32 words, float64 dequantized rows 0..63) of a random ``qtype`` weight: random block
    bytes with small f16 scales (no quantizer needed, nothing but numpy and ember); the
    reference is ``ember.quant``'s pure-Python dequantization of the first 64 rows."""
    from ember.quant import FORMATS

    fmt = FORMATS[qtype]
    if qtype in _SCALES:
        raw = rng.integers(0, 256, size=(n, k // fmt.block, fmt.nbytes), dtype=np.uint8)
        for p in _SCALES[qtype]:
            raw[:, :, p:p + 2] = rng.uniform(-0.05, 0.05, size=raw.shape[:2]).astype(np.float16).view(
                np.uint8).reshape(*raw.shape[:2], 2)
    else:
        vals = rng.standard_normal((n, k)).astype(np.float32)
        raw = {"f32": vals, "f16": vals.astype(np.float16), "bf16": (vals.view(np.uint32) >> 16).astype(np.uint16)}[qtype]
    raw = raw.reshape(n, -1).view(np.uint8)
    ref = np.frombuffer(fmt.dequantize(raw[:64].tobytes()), np.float32).reshape(-1, k).astype(np.float64)
    b = raw.tobytes()
    return np.frombuffer(b + bytes(-len(b) % 4), "<i4").copy(), ref


def _one_pass_timed(calls, cpu_adapter):
    """Seconds per call of ``calls`` (a list of thunks that each record one dispatch): all
    recorded into ONE compute pass (the driver's batch limit lifted), timed by GPU timestamps
    around that pass where the adapter has them, else by the wall clock of submit + wait."""
    import ember.webgpu.driver as drv

    calls[0]()
    wg.synchronize()
    old = drv.BATCH_DISPATCHES
    drv.BATCH_DISPATCHES = 1 << 30
    best = float("inf")
    try:
        for _ in range(TRIALS[0]):
            # (~30 ms of other GPU work first: the GPU at its clocks when the timed pass starts; the
            # first format a process timed read 94 GB/s of q4_1 without it, 538 after a q8_0 run)
            if BUSY[0] is not None:
                BUSY[0]()
            t_all = time.perf_counter()
            if TIMER[0] is not None:
                TIMER[0].start()
            keep = [c() for c in calls]      # each call writes its own output: no false dependences
            t0 = time.perf_counter()
            wg.synchronize()
            t1 = time.perf_counter()
            dt = t1 - t0
            if TIMER[0] is not None:
                dt = _gpu_vs_wall(f"{len(calls)} calls in one pass", TIMER[0].seconds(), t1 - t_all)
            best = min(best, dt / len(calls))
            del keep
    finally:
        drv.BATCH_DISPATCHES = old
    return best


def _evaluated(t):
    wg.evaluate(t)
    return t


def qlinear_rows(shapes, qtypes, cpu_adapter, layouts=GEMV_LAYOUTS, prompt=True):
    """Decode (M = 1) and prompt (M = 128) qlinear timings; see the module docstring. A format
    whose block does not divide k (a K-quant's 256 at k = 576) is left out of that shape."""
    from ember.quant import FORMATS
    from ember.registry import Meta
    from ember.webgpu import quant as wq

    rng = np.random.default_rng(3)
    rt = wg.get_runtime()
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        torch, cuda = None, False
    rows = []
    for n, k in shapes:
        x1 = rng.standard_normal((1, k)).astype(np.float32)
        xp = rng.standard_normal((128, k)).astype(np.float32)
        tx1, txp = ember.from_numpy(x1, device="webgpu"), ember.from_numpy(xp, device="webgpu")
        for qt in qtypes:
            if k % FORMATS[qt].block:
                print(f"(qlinear {qt} {n}x{k} left out: k is not a multiple of its {FORMATS[qt].block}-element block)")
                continue
            words, ref = _ql_weight(qt, n, k, rng)
            nbytes = words.nbytes
            # (at most 512 copies, 2048 calls: the uniform arena of one pass holds ~4096 dispatches)
            copies = 1 if cpu_adapter else min(512, max(1, -(-QL_PASS_BYTES // nbytes)))
            first = ember.from_numpy(words, device="webgpu")
            ws = [first] + [ember.from_numpy(words, device="webgpu") for _ in range(copies - 1)]
            got = ember.qlinear(txp[:64], first, qtype=qt, n=n, k=k).numpy()[:, :64]
            want = xp[:64].astype(np.float64) @ ref.T
            err = float(np.abs(got - want).max() / np.abs(want).max())
            if err > 1e-4:
                raise SystemExit(f"qlinear {qt} {n}x{k}: relative error {err:.2e}")
            # one x row: large 32-block and K-quant weights take gemv8 (x rounded to int8 per
            # block of 32: ~0.5% of the outputs' spread, as llama.cpp's int8 activations; these
            # random blocks on lavapipe, err1: q8_0 0.43%, q4_1 0.38%, q4_k 0.51%, q5_k 0.71%,
            # q6_k 0.64%)
            got1 = ember.qlinear(tx1, first, qtype=qt, n=n, k=k).numpy()[0, :64]
            err1 = float(np.abs(got1 - x1[0] @ ref.T).max() / np.abs(x1[0] @ ref.T).max())
            i8 = wq._use_gemv8(rt, qt, n, k, 64, 4)
            if err1 > (2e-2 if i8 else 1e-4):
                raise SystemExit(f"qlinear {qt} {n}x{k}, one row{' (gemv8)' if i8 else ''}: relative error {err1:.2e}")
            reps = 3 if cpu_adapter else min(2048, max(QL_MIN_REPS, 4 * copies))
            row = {"n": n, "k": k, "qtype": qt, "MB": nbytes / 1e6, "copies": copies}

            def decode_calls(reps=reps):
                return [lambda w=ws[i % copies]: ember.qlinear(tx1, w, qtype=qt, n=n, k=k) for i in range(reps)]

            def chained_calls(reps=reps):
                # each call's x is the previous call's first k outputs: every dispatch waits for the
                # one before (a barrier), as in a decode step, instead of overlapping with it
                state = [tx1]

                def call(w):
                    y = ember.qlinear(state[0], w, qtype=qt, n=n, k=k)
                    # (n < k, a down projection: y repeated to k columns, which adds the same
                    # copy to every layout's figure)
                    state[0] = y[:, :k] if n >= k else ember.concat([y] * -(-k // n), axis=1)[:, :k]
                    return y
                return [lambda w=ws[i % copies]: call(w) for i in range(reps)]
            lanes, rb, u, il, wgs = wq.gemv_shape(n, k, 1)
            if i8:   # gemv8 (no items per step)
                lanes, rb, wgs = wq.gemv8_shape(k, (lanes, rb, wgs),
                                                int(rt.limits.get("max_compute_invocations_per_workgroup", 256)))
                row["default"] = f"i8:{lanes}x{rb}" + (f"w{wgs}" if wgs != wq.WG else "")
            else:
                row["default"] = f"{lanes}x{rb}u{u}{'i' if il else ''}" + (f"w{wgs}" if wgs != wq.WG else "")
            if not rows and not cpu_adapter:
                # (the process's first timed format read 728 instead of 1,870 GB/s on an H100,
                # the same kernel timed again later: one untimed round first)
                _one_pass_timed(decode_calls(), cpu_adapter)
            dt = _one_pass_timed(decode_calls(), cpu_adapter)
            row["us"] = dt * 1e6
            row["GBs"] = nbytes / dt / 1e9
            row["fail"] = check_rate(f"qlinear decode {qt} {n}x{k}", flop=2.0 * n * k, nbytes=nbytes, seconds=dt)
            chain = not cpu_adapter
            if chain:
                dt = _one_pass_timed(chained_calls(), cpu_adapter)
                row["chained_us"], row["chained_GBs"] = dt * 1e6, nbytes / dt / 1e9
            if layouts and not cpu_adapter:
                row["layouts"] = {}
                for name in layouts:
                    env = _layout_env(name)
                    os.environ.update(env)
                    try:
                        dt = _one_pass_timed(decode_calls(), cpu_adapter)
                        dtc = _one_pass_timed(chained_calls(), cpu_adapter) if chain else None
                    finally:
                        for v in env:
                            os.environ.pop(v, None)
                    row["layouts"][name] = (nbytes / dt / 1e9, nbytes / dtc / 1e9 if dtc else None)
                    row["fail"] += check_rate(f"qlinear decode {qt} {n}x{k} layout {name}", nbytes=nbytes, seconds=dt)
            if not prompt:
                del ws
                rows.append(row)
                continue
            preps = 2 if cpu_adapter else max(QL_MIN_REPS // 4, copies)
            pcalls = [lambda w=ws[i % copies]: ember.qlinear(txp, w, qtype=qt, n=n, k=k) for i in range(preps)]
            dt = _one_pass_timed(pcalls, cpu_adapter)
            row["prompt_GFLOPs"] = 2.0 * 128 * n * k / dt / 1e9
            row["fail"] += check_rate(f"qlinear prompt {qt} {n}x{k}", flop=2.0 * 128 * n * k, seconds=dt)
            if not cpu_adapter:   # the other prompt paths: scalar tiles; dequantize + autotuned matmul
                for mode in ("tiled", "dequant"):
                    os.environ["EMBER_QLINEAR_PROMPT"] = mode
                    try:
                        if mode == "dequant":
                            ember.qlinear(txp, first, qtype=qt, n=n, k=k).numpy()   # autotune first
                        dt = _one_pass_timed(pcalls, cpu_adapter)
                    finally:
                        os.environ.pop("EMBER_QLINEAR_PROMPT", None)
                    row["prompt_" + mode] = 2.0 * 128 * n * k / dt / 1e9
            del ws
            rows.append(row)
        # peers: the same batch-1 product with a float32 weight (ember) and PyTorch fp16 (CUDA)
        w32 = rng.standard_normal((n, k)).astype(np.float32)
        fcopies = 1 if cpu_adapter else min(512, max(1, -(-QL_PASS_BYTES // w32.nbytes)))
        fws = [ember.from_numpy(w32, device="webgpu").permute_dims((1, 0)) for _ in range(fcopies)]
        freps = 3 if cpu_adapter else max(32, 2 * fcopies)
        dt = _one_pass_timed([lambda w=fws[i % fcopies]: _evaluated(tx1 @ w) for i in range(freps)], cpu_adapter)
        peer = {"n": n, "k": k, "qtype": "f32 matmul", "MB": w32.nbytes / 1e6, "us": dt * 1e6,
                "GBs": w32.nbytes / dt / 1e9,
                "fail": check_rate(f"f32 batch-1 linear {n}x{k}", nbytes=w32.nbytes, seconds=dt)}
        del fws
        if cuda:
            wh = [torch.from_numpy(w32).cuda().half() for _ in range(max(1, -(-QL_PASS_BYTES // (w32.nbytes // 2))))]
            xh = torch.from_numpy(x1).cuda().half()
            torch.nn.functional.linear(xh, wh[0])
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            r = 200
            for i in range(r):
                torch.nn.functional.linear(xh, wh[i % len(wh)])
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / r
            peer["torch_fp16_GBs"] = w32.nbytes / 2 / dt / 1e9
            del wh
        rows.append(peer)
    return rows


# SmolLM2-135M's batch-1 products of one token: 30 layers of q/k/v/o (576 -> 576/192/192/576),
# gate/up (576 -> 1536) and down (1536 -> 576) in q4_1, and the tied q8_0 head (576 -> 49152)
SMOL_LAYER = ((576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536))


def smol_token(cpu_adapter, layers=30):
    """GPU time of the qlinear products of one SmolLM2 decode token, every weight distinct (as
    in the model: nothing stays in cache between tokens), all recorded into one pass."""
    rng = np.random.default_rng(4)
    layer = [(n, k, _ql_weight("q4_1", n, k, rng)[0]) for n, k in SMOL_LAYER]
    # (each layer its own GPU buffers, the same bytes)
    tensors = [(n, k, ember.from_numpy(wd, device="webgpu"), "q4_1") for _ in range(layers) for n, k, wd in layer]
    head, _ = _ql_weight("q8_0", 49152, 576, rng)
    tensors.append((49152, 576, ember.from_numpy(head, device="webgpu"), "q8_0"))
    xs = {k: ember.from_numpy(rng.standard_normal((1, k)).astype(np.float32), device="webgpu") for k in (576, 1536)}
    nbytes = sum(int(t.shape[0]) * 4 for _, _, t, _ in tensors)
    calls = [lambda n=n, k=k, w=w, qt=qt: ember.qlinear(xs[k], w, qtype=qt, n=n, k=k) for n, k, w, qt in tensors]
    dt = _one_pass_timed(calls, cpu_adapter) * len(calls)
    check_rate("one SmolLM2 token's products", nbytes=nbytes, seconds=dt)
    return {"products": len(calls), "MB": nbytes / 1e6, "ms": dt * 1e3, "GBs": nbytes / dt / 1e9}


def print_qlinear(rows, peak):
    print("\nqlinear batch-1 decode (matrix-vector kernel): GB/s of weight read per call"
          + (f", % of {peak:.0f} GB/s" if peak else "") + "; prompt: 128 rows, tiled kernel, GFLOP/s;"
          " calls independent (they overlap on the GPU), and 'chained': each call's x the previous"
          " call's output (each waits for the one before, as in a decode step); layouts: independent/chained")
    print(f"{'shape':>11} {'qtype':>10} {'MB':>7} {'copies':>6} {'us/call':>9} {'GB/s':>8}"
          + (f" {'%peak':>6}" if peak else "") + f" {'layout':>9} {'prompt':>9}  layouts (lanes x rows u items [i interleaved, s x staged]: GB/s)")
    for r in rows:
        pct = f" {100 * r['GBs'] / peak:>5.1f}%" if peak else ""
        extra = ""
        if "layouts" in r:
            extra = "  " + " ".join(f"{name} {v:.0f}" + (f"/{c:.0f}" if c else "") for name, (v, c) in r["layouts"].items())
        if "torch_fp16_GBs" in r:
            extra = f"  torch fp16 (CUDA) {r['torch_fp16_GBs']:.0f} GB/s"
        prompt = f"{r['prompt_GFLOPs']:>9.1f}" if "prompt_GFLOPs" in r else f"{'-':>9}"
        if "prompt_tiled" in r:
            extra += f"  | prompt scalar tiles {r['prompt_tiled']:.0f}, dequantize+matmul {r['prompt_dequant']:.0f} GFLOP/s"
        print(f"{r['n']:>5}x{r['k']:<5} {r['qtype']:>10} {r['MB']:>7.2f} {r.get('copies', '-'):>6} {r['us']:>9.1f} "
              f"{r['GBs']:>8.1f}{pct} {r.get('default', '-'):>9} {prompt}{extra}{r.get('fail', '')}")
        if "chained_GBs" in r:
            cp = f" {100 * r['chained_GBs'] / peak:>5.1f}%" if peak else ""
            print(f"{'':>11} {'chained':>10} {'':>7} {'':>6} {r['chained_us']:>9.1f} {r['chained_GBs']:>8.1f}{cp}")


def replay_rows(layers: int = 64, width: int = 64, reps: int = 50) -> list:
    """Host time of a replayed plan (``ember.compile``) per dispatch: an MLP of ``layers``
    Linear+GELU blocks at batch 1, replayed step by step (each kernel's Python records its
    dispatches) and as a prebuilt dispatch stream (``ember.webgpu.replay``). ``host``: the
    Python of one call (the GPU runs meanwhile); ``encode``: the stream's loop of direct C calls
    alone (encoded into a pass that is never submitted); ``wall``: calls + the final wait."""
    from ember import nn
    from ember.webgpu import replay

    rt = wg.get_runtime()
    ember.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*blocks).to("webgpu")
    x = ember.from_numpy(np.random.default_rng(5).standard_normal((1, width)).astype(np.float32), device="webgpu")
    rows = []
    outs = {}
    old = replay.ENABLED
    try:
        for mode in ("steps", "stream"):
            replay.ENABLED = mode == "stream"
            with ember.no_grad():
                f = ember.compile(model)
                for _ in range(3):
                    outs[mode] = f(x).numpy()
                wg.synchronize()
                t0 = time.perf_counter()
                for _ in range(reps):
                    r = f(x)
                t1 = time.perf_counter()
                wg.evaluate(r)
                wg.synchronize()
                t2 = time.perf_counter()
                plan = f.plan_for(x)
            fast = plan.fast if plan.fast not in (None, False) else None
            n = fast.describe()["dispatches"] if fast is not None and fast.stream is not None else None
            if n is None:
                rt.reset_stats()
                with ember.no_grad():
                    wg.evaluate(f(x))
                n = rt.stats["dispatches"]
            row = {"mode": mode, "dispatches": n, "host_us": (t1 - t0) / reps * 1e6, "wall_us": (t2 - t0) / reps * 1e6}
            if fast is not None and fast.stream is not None and rt.driver._c is not None:
                drv = rt.driver
                fast_, cmds, _, chunks, native = fast.stream.prepared
                set_pipeline, set_bind_group, dispatch, null = drv._c
                best = best_n = float("inf")
                for _ in range(10):
                    enc = drv._dev.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    c = cp._internal
                    a = time.perf_counter()
                    for p_, b_, gx, gy, gz in cmds:
                        if p_ is not None:
                            set_pipeline(c, p_)
                        set_bind_group(c, 0, b_, 0, null)
                        dispatch(c, gx, gy, gz)
                    best = min(best, time.perf_counter() - a)
                    cp.end()
                    enc.finish()
                    if native is not None:     # ember.native's C loop (core/native/encode.c), chunk by chunk
                        (fn, ffi, fps), words = native
                        enc = drv._dev.create_command_encoder()
                        cp = enc.begin_compute_pass()
                        c = int(ffi.cast("uintptr_t", cp._internal))
                        a = time.perf_counter()
                        for (lo, hi), (_, addr) in zip(chunks, words):
                            fn(c, *fps, addr, hi - lo)
                        best_n = min(best_n, time.perf_counter() - a)
                        cp.end()
                        enc.finish()
                row["encode_us"] = best * 1e6
                if native is not None:
                    row["encode_native_us"] = best_n * 1e6
            rows.append(row)
    finally:
        replay.ENABLED = old
    if outs["steps"].tobytes() != outs["stream"].tobytes():
        FAILURES.append("replay: the stream's output differs from the step-by-step replay's")
    return rows


def print_replay(rows) -> None:
    print("\nreplayed plan (MLP of Linear+GELU, batch 1): host time per call and per dispatch")
    for r in rows:
        n = max(r["dispatches"], 1)
        enc = f", encode loop {r['encode_us'] / n:.2f} us/dispatch" if "encode_us" in r else ""
        if "encode_native_us" in r:
            enc += f" (cffi calls; ember.native's C loop {r['encode_native_us'] / n:.2f})"
        print(f"  {r['mode']:>6}: {r['dispatches']} dispatches, host {r['host_us']:.0f} us/call "
              f"({r['host_us'] / n:.2f} us/dispatch){enc}, wall {r['wall_us']:.0f} us/call")


def print_failures() -> None:
    if FAILURES:
        print(f"\nBENCHMARK FAILURES ({len(FAILURES)}): figures above the device's peak or GPU time "
              f"that the wall clock contradicts:")
        for f in FAILURES:
            print("  - " + f)
    else:
        print("\nbenchmark checks: every GPU figure within the wall time that contained it"
              + (f" and under the peaks ({PEAK['tflops']} TFLOP/s, {PEAK['gbs']} GB/s)" if PEAK["tflops"] else
                 " (no peak known for this adapter: --peak-tflops/--peak-gbs)"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=_arg_list, default=None, help="square matmul sizes (default 256,512,1024[,2048])")
    p.add_argument("--gelu", type=int, default=None, help="GELU chain length (default 4M floats, 1M on a CPU adapter)")
    p.add_argument("--budget", type=float, default=None, help="seconds per timing (default 0.5, 2 on a CPU adapter)")
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke test)")
    p.add_argument("--no-cpu-peers", action="store_true", help="skip numpy and PyTorch on the CPU")
    p.add_argument("--qlinear", action="store_true", help="only the quantized linear section")
    p.add_argument("--qtypes", default="q4_1,q8_0", help="qlinear formats (default q4_1,q8_0)")
    p.add_argument("--qshapes", default=None, help="qlinear (n)x(k) shapes, e.g. 4096x4096,576x1536")
    p.add_argument("--qlayouts", default=None, help="qlinear batch-1 layouts swept, e.g. 16x1u4,64x1u4i "
                   "(default: all of GEMV_LAYOUTS; none: no sweep)")
    p.add_argument("--no-qprompt", action="store_true", help="qlinear: batch-1 decode only (no 128-row prompt)")
    p.add_argument("--peak-gbs", type=float, default=None, help="the GPU's memory bandwidth (H200: 4800)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the GPU's fp32 peak (H200: 67)")
    p.add_argument("--replay", action="store_true", help="only the replayed-plan host-time section")
    p.add_argument("--f16", action="store_true", help="only the float16 matmul section (half storage, "
                   "the 4-byte form, float32, PyTorch fp16)")
    args = p.parse_args(argv)

    os.environ.setdefault("EMBER_AUTOTUNE", "on")
    info = wg.info()
    cpu = str(info.get("adapter_type", "")).upper() == "CPU" or "llvmpipe" in str(info.get("device", "")) \
        or "swiftshader" in str(info.get("architecture", "")).lower()
    sizes = args.sizes or ([128, 256] if args.quick else [256, 512, 1024] if cpu else [256, 512, 1024, 2048])
    gelu_n = args.gelu or ((1 << 16) if args.quick else (1 << 20) if cpu else (1 << 22))
    budget = args.budget or (0.2 if args.quick else 2.0 if cpu else 0.05)
    TRIALS[0] = 1 if cpu or args.quick else 3
    TIMER[0] = PassTimer.install(wg.get_runtime())
    set_peaks(info, args.peak_tflops, args.peak_gbs)
    args.peak_gbs = PEAK["gbs"]
    if TIMER[0] is not None and not cpu:
        BUSY[0] = keep_busy(wg.get_runtime())
    print(f"adapter: {info.get('device')} / {info.get('description')} ({info.get('backend')}, "
          f"{info.get('adapter_type')}); features: {', '.join(info.get('features', []))}")
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}")
    print("kernel timing: " + ("GPU timestamps around every submitted pass, summed, checked against the "
                               "wall clock" if TIMER[0] else "wall clock of submit + wait (recording excluded)"))

    if args.replay:
        print_replay(replay_rows())
        print_failures()
        return

    if args.f16:
        print_f16(*f16_rows(sizes, budget, cpu))
        print_failures()
        return

    if args.qlinear:
        shapes = QL_SHAPES if not args.qshapes else [tuple(int(v) for v in sh.split("x")) for sh in args.qshapes.split(",")]
        lays = GEMV_LAYOUTS if args.qlayouts is None else [v for v in args.qlayouts.split(",") if v and v != "none"]
        print_qlinear(qlinear_rows(shapes, args.qtypes.split(","), cpu, lays, not args.no_qprompt), args.peak_gbs)
        tok = smol_token(cpu, layers=2 if cpu else 30)
        print(f"\none SmolLM2-135M decode token's qlinear products ({tok['products']} dispatches, "
              f"{tok['MB']:.1f} MB of weights, every weight distinct, one pass): {tok['ms']:.3f} ms of GPU time, "
              f"{tok['GBs']:.1f} GB/s" + (" (2 layers of 30 on a CPU adapter)" if cpu else
                                          f" -> at most {1e3 / tok['ms']:.0f} tokens/s from the products alone"))
        print_failures()
        return

    rows = matmul_table(sizes, budget, cpu, not args.no_cpu_peers)
    cols = list(linalg.VARIANTS) + ["auto", "auto_e2e", "numpy", "torch_cpu", "torch_cuda"]
    cols = [c for c in cols if any(c in r for r in rows)]
    print("\nmatmul float32 n x n @ n x n, GFLOP/s (higher is better); 'auto' = the autotuned choice")
    print(f"{'n':>6} " + " ".join(f"{c:>10}" for c in cols) + f" {'chosen':>8} {'tune s':>7}  auto/peer")
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append(f"{'-' if v is None else f'{v:.1f}':>10}")
        peer = r.get("torch_cuda") or r.get("numpy")
        ratio = r["auto"] / peer if peer else float("nan")
        extra = ""
        if r.get("torch_cuda"):   # every variant against the same-GPU peer
            extra = " [" + " ".join(f"{c} {r[c] / peer:.2f}x" for c in linalg.VARIANTS if r.get(c)) + "]"
        peer_name = "torch_cuda" if r.get("torch_cuda") else "numpy"
        print(f"{r['n']:>6} " + " ".join(cells) + f" {r['chosen']:>8} {r['autotune_s']:>7.2f}  {ratio:.3f}x {peer_name}{extra}"
              + r.get("fail", ""))

    k = max(sizes)
    lr = linear_row(k, budget)
    print(f"\nbatch-1 linear x(1, {k}) @ W.T ({k}x{k}), GFLOP/s (GB/s of weight read): "
          + ", ".join(f"{c} {lr[c]:.2f}" + (f" ({lr[c + '_GBs']:.0f} GB/s"
                                              + (f", {100 * lr[c + '_GBs'] / PEAK['gbs']:.0f}% of HBM" if PEAK["gbs"] else "")
                                              + ")" if c + "_GBs" in lr else "")
                      for c in list(linalg.VARIANTS) + ["numpy"] if c in lr) + lr.get("fail", ""))

    g = gelu_rows(gelu_n, budget)
    f_dt, f_n = g["fused"]
    u_dt, u_n = g["unfused"]
    print(f"\nGELU chain x * ((x / sqrt(2)).erf() + 1) / 2 on {gelu_n} floats:")
    print(f"  fused   {f_dt * 1e3:9.3f} ms  ({f_n} dispatch{'es' if f_n != 1 else ''})")
    print(f"  unfused {u_dt * 1e3:9.3f} ms  ({u_n} dispatches, EMBER_FUSION=off)")
    print(f"  unfused / fused = {u_dt / f_dt:.2f}x")
    print_replay(replay_rows())
    print_failures()
    print("\nNote: timings are GPU throughput (many calls, one wait); on a CPU adapter they measure a "
          "software rasteriser, so compare ratios, not absolute numbers.")


if __name__ == "__main__":
    main()
