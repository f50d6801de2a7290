"""The numpy backend's language-model ops with and without ember.native's llm.c (the wasm kernels
compiled for this CPU through SIMDe): us per ``rms_norm``, ``rope`` and ``attention_cached`` call
through ember at a decode step's sizes, the two paths alternating in one process (best of
``--reps`` each, twice), with the load average.

    EMBER_NATIVE=require python tests/bench/bench_native_llm.py [--heads 9,3,64] [--positions 10,300,1500]
                                    [--tokens 1,4,16] [--context 2048] [--window 0] [--softcap 0] [--reps 200]

``--tokens``: new tokens per attention call (1: a decode step; more: a prompt chunk, which
numpy_llm sends to the kernel only below NATIVE_ATTENTION_WORK: this bench calls the kernel
regardless, to measure where that bound lies).

Defaults: SmolLM2-135M's heads (9 query, 3 key/value, 64 features; hidden 576). Numbers:
notes/native-llm.md.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import ember
from ember.backends import numpy_llm as nl
from bench_quant import best_ms     # (run as a script: tests/bench is on sys.path)


def best_us(fn, reps: int) -> float:
    return best_ms(fn, reps) * 1e3


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="9,3,64", help="query heads, key/value heads, head size")
    ap.add_argument("--positions", default="10,300,1500")
    ap.add_argument("--tokens", default="1")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--softcap", type=float, default=0.0)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args(argv)
    if not nl.native_llm():
        raise SystemExit(f"ember.native has no llm kernels here: {ember.native.info()}")
    hq, hkv, d = (int(v) for v in a.heads.split(","))
    C, rng = a.context, np.random.default_rng(0)
    t = lambda *s: ember.from_numpy(rng.standard_normal(s).astype(np.float32), device="numpy")   # noqa: E731
    hidden = hq * d
    x, w = t(1, hidden), t(hidden)
    xr, cs, sn = t(1, hq + hkv, d), t(1, d // 2), t(1, d // 2)
    kc, vc = t(C, hkv, d), t(C, hkv, d)
    extra = {k_: v_ for k_, v_ in (("window", a.window), ("softcap", a.softcap)) if v_}
    cases = [(f"rms_norm (1, {hidden})", lambda: ember.rms_norm(x, w)),
             (f"rope (1, {hq + hkv}, {d})", lambda: ember.rope(xr, cs, sn))]
    for T in (int(v) for v in a.tokens.split(",")):
        q, k, v = t(T, hq, d), t(T, hkv, d), t(T, hkv, d)
        for p in (int(v) for v in a.positions.split(",")):
            pos = ember.tensor([p], dtype="int32", device="numpy")
            cases.append((f"attention_cached T {T} pos {p} (C {C})",
                          lambda q=q, k=k, v=v, pos=pos: ember.attention_cached(q, k, v, kc, vc, pos, **extra)))
    nl.NATIVE_ATTENTION_WORK = 1 << 62
    real = nl._native_fn
    print(f"load {os.getloadavg()[0]:.2f} / {os.getloadavg()[1]:.2f} / {os.getloadavg()[2]:.2f}; "
          f"heads {hq}/{hkv}/{d}, {extra or 'no window/softcap'}, best of {a.reps}")
    print(f"{'op':40s} {'numpy us':>9s} {'native us':>10s} {'x':>6s}")
    for name, fn in cases:
        best = {"numpy": float("inf"), "native": float("inf")}
        for _ in range(2):
            for path in ("numpy", "native"):
                nl._native_fn = real if path == "native" else (lambda n: None)
                try:
                    best[path] = min(best[path], best_us(fn, a.reps))
                finally:
                    nl._native_fn = real
        print(f"{name:40s} {best['numpy']:9.1f} {best['native']:10.1f} {best['numpy'] / best['native']:6.1f}")
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
