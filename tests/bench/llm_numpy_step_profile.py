"""SmolLM2-135M's decode step on device numpy: the replayed step's time and each op kind's share.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE EMBER_NATIVE=require \\
        .venv/bin/python tests/bench/llm_numpy_step_profile.py [--q8] [--ops] [--generate N]

Loads demos/chat/SmolLM2-135M-Instruct.Q4_1.gguf (``--q8``: its Q8_0 re-quantization, made and
cached by bench_llm.ensure_q8_0), runs a 200-token prompt and 4 new tokens (the step's plan is
compiled), then:

- ``step``: the compiled step alone (``model._step_argmax``) at positions 200..263, one call each:
  the median and the fastest, in ms;
- ``--ops``: the step's ops at position 230 through ``NumpyReplay.profile``, each op's fastest of
  20 runs, summed by op name (count, total ms, us an op): on a shared machine the fastest run is
  the op's own cost, its sums without the waiting;
- ``--generate N``: ``model.generate`` of N new tokens after a ~200-token prompt (greedy; the
  stats' decode tokens per second and the tokens made: a generation may stop at an end token).

Every figure is one line ``key value`` after the tables, for scripts that alternate two trees.
Report ``uptime``'s load average with the figures: the machine may be shared.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--q8", action="store_true", help="the Q8_0 re-quantization (bench_llm.ensure_q8_0)")
    ap.add_argument("--ops", action="store_true", help="per-op fastest times at position 230")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="also generate N tokens: decode tok/s")
    ap.add_argument("--steps", type=int, default=64, help="step calls timed (positions 200..)")
    args = ap.parse_args()

    import ember
    import ember.llm
    from bench_llm import ensure_q8_0

    src = ROOT / "demos/chat/SmolLM2-135M-Instruct.Q4_1.gguf"
    path = ensure_q8_0(src) if args.q8 else src
    m = ember.llm.load(str(path), device="numpy")
    ids = m.tokenizer.encode("Once upon a time " * 40)[:200]
    m.generate(ids, max_tokens=4)
    step = m._step_argmax
    fast = next(iter(step.plans.values())).fast
    T = ember.tensor
    tok = T([int(ids[-1])], dtype="int64", device="numpy")
    out = {}
    if fast is not None:
        out["ops"] = len(fast.ops)
    ts = []
    for p in range(200, 200 + args.steps):
        t = time.perf_counter()
        step(tok, T([p], dtype="int32", device="numpy")).tolist()
        ts.append(time.perf_counter() - t)
    out["step_ms_median"] = 1e3 * statistics.median(ts)
    out["step_ms_min"] = 1e3 * min(ts)
    if args.ops and fast is not None:
        best = None
        for _ in range(20):
            steps: list = []
            fast.profile([tok, T([230], dtype="int32", device="numpy")], {}, steps)
            best = steps if best is None else [(a[0], min(a[1], b[1])) for a, b in zip(best, steps)]
        tot: dict = {}
        for k, dt in best:
            c, s = tot.get(k, (0, 0.0))
            tot[k] = (c + 1, s + dt)
        out["ops_best_ms"] = 1e3 * sum(d for _, d in best)
        for k, (c, s) in sorted(tot.items(), key=lambda x: -x[1][1]):
            print(f"{k:32} {c:4d} {1e3 * s:8.3f} ms {1e6 * s / c:7.1f} us/op")
    if args.generate:
        prompt = m.tokenizer.encode("Write a long story about a dragon who learns to cook. " * 12)[:200]
        m.generate(prompt, max_tokens=args.generate)
        out["decode_tok_s"] = m.stats["decode_tokens_per_second"]
        out["decode_tokens"] = m.stats.get("tokens")
    for k, v in out.items():
        print(k, f"{v:.3f}" if isinstance(v, float) else v)


if __name__ == "__main__":
    main()
