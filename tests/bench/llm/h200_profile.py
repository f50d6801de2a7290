"""Where a replayed SmolLM2-shaped decode step spends its time on a GPU (webgpu, native): the
GPU time of each kernel of the step's dispatch stream (each dispatch replayed in a pass of its
own between GPU timestamps, summed per pipeline) and a cProfile of the host side of 64 steps.

    python tests/bench/llm/h200_profile.py [--out /tmp/smol]   (after h200_smol_shape.py wrote the GGUF)
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/smol")
    ap.add_argument("--small", action="store_true", help="2 layers, vocabulary 1024 (a smoke test on a CPU adapter)")
    a = ap.parse_args()
    import ember
    from ember import ops as F
    from ember.io.gguf import load_gguf
    from ember.nn.llama import Llama
    from ember.tensor import tensor
    from ember.webgpu.runtime import get_runtime
    from bench_webgpu import PassTimer, print_stream_profile
    from h200_smol_shape import write_gguf

    p = Path(a.out) / "smol_shape.gguf"
    if a.small:
        import h200_smol_shape

        h200_smol_shape.CFG.update(n_layers=2, vocab=1024)
        p = Path(a.out) / "small_shape.gguf"
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        write_gguf(p)
    m = Llama.from_gguf(load_gguf(str(p)), device="webgpu", context=1024)
    step = ember.compile(lambda ids, pos: F.llm.greedy_tokens(m.forward(ids, pos)))   # as ember.llm's step
    tok = 5
    for pos in range(4):
        tok = int(step(tensor([tok], dtype="int32", device="webgpu"), tensor([pos], dtype="int32", device="webgpu")).tolist()[0])
    rt = get_runtime()
    plan = step.plan_for(tensor([tok], dtype="int32", device="webgpu"), tensor([0], dtype="int32", device="webgpu"))
    stream = plan.fast.stream
    timer = PassTimer.install(rt)
    drv = rt.driver
    dev = drv._dev
    print_stream_profile(rt, stream, timer)
    # the same stream in one pass (as a replay runs it)
    timer.start()
    t0 = time.perf_counter()
    for pos in range(4, 36):
        r = step(tensor([tok], dtype="int32", device="webgpu"), tensor([pos], dtype="int32", device="webgpu"))
    r.tolist()
    wall = time.perf_counter() - t0
    print(f"one pass per step: GPU {timer.seconds() / 32 * 1e3:.3f} ms/step, wall {wall / 32 * 1e3:.3f} ms/step")
    drv.timer = None
    # host time of a replay, split: wgpu-native's finish and submit vs the rest (ember's Python,
    # the direct C calls that record each dispatch); steps only enqueued, read once at the end
    enc_cls, q_cls = type(dev.create_command_encoder()), type(dev.queue)
    spent = {"finish": 0.0, "submit": 0.0}
    orig = enc_cls.finish, q_cls.submit

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper
    enc_cls.finish, q_cls.submit = timed("finish", orig[0]), timed("submit", orig[1])
    try:
        n = 64
        t0 = time.perf_counter()
        for pos in range(100, 100 + n):
            r = step(tensor([tok], dtype="int32", device="webgpu"), tensor([pos], dtype="int32", device="webgpu"))
        host = time.perf_counter() - t0
        r.tolist()
    finally:
        enc_cls.finish, q_cls.submit = orig
    nd = len(stream.cmds)
    print(f"host per step ({n} steps enqueued, one read at the end): {host / n * 1e3:.3f} ms = "
          f"{host / n / nd * 1e6:.2f} us per dispatch; finish {spent['finish'] / n * 1e3:.3f} ms, "
          f"submit {spent['submit'] / n * 1e3:.3f} ms, the rest {(host - spent['finish'] - spent['submit']) / n * 1e3:.3f} ms")
    pr = cProfile.Profile()
    pr.enable()
    for pos in range(36, 100):
        r = step(tensor([tok], dtype="int32", device="webgpu"), tensor([pos], dtype="int32", device="webgpu"))
        int(r.tolist()[0])
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


if __name__ == "__main__":
    main()
