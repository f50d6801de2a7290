"""wasm benchmark, elementwise family: the SIMD kernels of device "wasm" next to the pure-Python
backend inside Pyodide under Node (V8), single-threaded.

    .venv/bin/python tests/bench/bench_wasm_elementwise.py [--quick]

From CPython this builds the kernel module and the wheel (in a temporary folder) and runs itself
inside Pyodide through wasm/run_pyodide.mjs. Inside it prints one table: throughput in GB/s
(bytes read + written once) on 1M float32 elements for add / bias add / exp / gelu / sigmoid,
softmax and layer_norm on (512, 384) and (8*12, 64, 64), a row sum, and the cost of one small op
(16 elements) through ember's API, which is what a model with hundreds of ops per forward pays.
Every wasm result is checked against the python backend's first. Medians of repeated runs.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None


def host_main(argv) -> int:
    import glob
    import shutil
    import subprocess
    import tempfile

    root = os.path.dirname(os.path.dirname(HERE))
    node = shutil.which("node")
    if node is None:
        print("needs Node.js 20+ (python build.py setup)", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(root, "wasm"))
    import build_kernels
    sys.path.pop(0)
    build_kernels.ensure()
    with tempfile.TemporaryDirectory(prefix="ember-bench-ew-") as tmp:
        py = os.path.join(root, ".venv", "bin", "python")
        subprocess.run([py if os.path.exists(py) else sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", tmp, root], check=True, cwd=tmp)
        shutil.rmtree(os.path.join(root, "build"), ignore_errors=True)
        (whl,) = glob.glob(os.path.join(tmp, "ember-*.whl"))
        return subprocess.run([node, os.path.join(root, "wasm", "run_pyodide.mjs"), "--wheel", whl,
                               os.path.abspath(__file__), *argv]).returncode


def timeit(fn, min_time):
    import statistics
    import time

    fn()
    times = []
    start = time.perf_counter()
    while len(times) < 2000:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
        if (len(times) >= 5 and elapsed >= min_time) or (len(times) >= 2 and elapsed >= 4 * min_time):
            break
    return statistics.median(times)


def guest_main(argv) -> int:
    import random
    from array import array

    import ember
    from ember.backends import get_backend

    quick = "--quick" in argv
    t_wasm, t_py = (0.2, 0.5) if quick else (0.5, 1.5)
    print(f"ember wasm elementwise benchmark: Pyodide {sys.version.split()[0]}, {get_backend('wasm').available()[1]}")
    rng = random.Random(0)

    def rand(shape, lo=-3.0, hi=3.0):
        n = 1
        for s in shape:
            n *= s
        a = array("f", [rng.uniform(lo, hi) for _ in range(n)])
        return ember.from_bytes(a.tobytes(), shape, "float32", device="wasm")

    def wrong(name, got, want):
        g, w = array("f", got.to("python")._buf), array("f", want._buf)
        scale = max(1.0, max(abs(v) for v in w))
        err = max(abs(x - y) for x, y in zip(g, w)) / scale
        if err > 1e-5:
            print(f"WRONG: {name}: wasm and python differ by {err:.2e} (relative to the largest value)")
        return err > 1e-5

    M = 1 << 20
    cases = [   # name, inputs (shapes), fn, bytes moved per call
        ("add 1M + 1M", [(M,), (M,)], lambda a, b: a + b, 12 * M),
        ("add (1024,1024) + bias (1024,)", [(1024, 1024), (1024,)], lambda a, b: a + b, 8 * M),
        ("multiply 1M * scalar", [(M,)], lambda a: a * 0.5, 8 * M),
        ("exp 1M", [(M,)], ember.exp, 8 * M),
        ("sigmoid 1M", [(M,)], ember.sigmoid, 8 * M),
        ("gelu (erf) 1M", [(M,)], ember.gelu, 8 * M),
        ("gelu (tanh) 1M", [(M,)], lambda x: ember.gelu(x, approximate="tanh"), 8 * M),
        ("softmax (512, 384)", [(512, 384)], ember.softmax, 8 * 512 * 384),
        ("softmax (96, 64, 64)", [(96, 64, 64)], ember.softmax, 8 * 96 * 64 * 64),
        ("layer_norm (512, 384) over 384", [(512, 384), (384,), (384,)],
         lambda x, w, b: ember.layer_norm(x, 384, w, b), 8 * 512 * 384),
        ("layer_norm (96, 64, 64) over 64", [(96, 64, 64), (64,), (64,)],
         lambda x, w, b: ember.layer_norm(x, 64, w, b), 8 * 96 * 64 * 64),
        ("sum (512, 384) over axis -1", [(512, 384)], lambda x: x.sum(axis=-1), 4 * 512 * 384),
        ("sum (512, 384) over axis 0", [(512, 384)], lambda x: x.sum(axis=0), 4 * 512 * 384),
    ]
    rows = []
    for name, shapes, fn, nbytes in cases:
        xs = [rand(s) for s in shapes]
        ps = [x.to("python") for x in xs]
        if wrong(name, fn(*xs), fn(*ps)):
            return 1
        tw = timeit(lambda: fn(*xs), t_wasm)
        tp = timeit(lambda: fn(*ps), t_py)
        rows.append((name, f"{nbytes / tw / 1e9:.2f} GB/s ({tw * 1e3:.3f} ms)", f"{nbytes / tp / 1e9:.4f} GB/s",
                     f"{tp / tw:.0f}x"))
    # per-op cost on tiny tensors: Python overhead (shape/dtype rules, wrappers, the call into wasm)
    small = [("add (16,) + (16,)", [(16,), (16,)], lambda a, b: a + b),
             ("add (4, 16) + (16,)", [(4, 16), (16,)], lambda a, b: a + b),
             ("exp (16,)", [(16,)], ember.exp), ("gelu (16,)", [(16,)], ember.gelu),
             ("softmax (4, 16)", [(4, 16)], ember.softmax), ("sum (4, 16) axis -1", [(4, 16)], lambda x: x.sum(axis=-1))]
    for name, shapes, fn in small:
        xs = [rand(s) for s in shapes]
        ps = [x.to("python") for x in xs]
        tw = timeit(lambda: fn(*xs), t_wasm)
        tp = timeit(lambda: fn(*ps), t_wasm)
        rows.append((name, f"{tw * 1e6:.1f} us per op", f"{tp * 1e6:.1f} us", f"{tp / tw:.1f}x"))
    rt = get_backend("wasm").rt
    from ember.wasm.runtime import R, W
    a, y = array("f", [0.0]) * 16, array("f", [0.0]) * 16
    tw = timeit(lambda: rt.call("exp_f32", R(a, 16), W(y, 16), 16), t_wasm)
    rows.append(("rt.call('exp_f32') on 16 elements (no ember)", f"{tw * 1e6:.1f} us per call", "-", "-"))

    width = max(len(r[0]) for r in rows)
    print(f"\n| {'case':<{width}} | {'wasm':>28} | {'python':>14} | python/wasm |")
    print(f"|{'-' * (width + 2)}|{'-' * 30}|{'-' * 16}|-------------|")
    for name, w, p, r in rows:
        print(f"| {name:<{width}} | {w:>28} | {p:>14} | {r:>11} |")
    return 0


if __name__ == "__main__":
    if sys.platform == "emscripten":
        _rc = guest_main(sys.argv[1:])
        if _rc:
            raise SystemExit(_rc)
    else:
        raise SystemExit(host_main(sys.argv[1:]))
