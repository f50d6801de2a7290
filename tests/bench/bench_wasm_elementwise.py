"""wasm benchmark, elementwise family: the SIMD kernels of device "wasm" next to the pure-Python
backend inside Pyodide under Node (V8), single-threaded.

    .venv/bin/python tests/bench/bench_wasm_elementwise.py [--quick]
    .venv/bin/python tests/bench/bench_wasm_elementwise.py --native    # raw kernels under wasmtime

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


def native_main(argv) -> int:
    """``--native``: the raw kernels (no ember, no Python between elements) under wasmtime in
    CPython, on buffers that stay in the module's memory: what the SIMD code itself does on this
    CPU (Cranelift compiles it; V8 in the page is comparable), without Pyodide's per-call costs."""
    import random
    import time

    import wasmtime

    path = os.path.join(os.path.dirname(os.path.dirname(HERE)), "wasm", "kernels.wasm")
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    mem = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(1024, None)))   # 64 MiB
    ex = wasmtime.Instance(store, wasmtime.Module.from_file(engine, path), [mem]).exports(store)
    n = 1 << 20
    x, y, z = 1 << 16, (1 << 16) + 4 * n + 64, (1 << 16) + 8 * n + 128
    rng = random.Random(0)
    import struct
    mem.write(store, struct.pack(f"<{n}f", *[rng.uniform(-3, 3) for _ in range(n)]), x)
    mem.write(store, struct.pack(f"<{n}f", *[rng.uniform(-3, 3) for _ in range(n)]), z)

    def run(name, fn, nbytes):
        fn()
        best, start = 1e9, time.perf_counter()
        while time.perf_counter() - start < 1.0:
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        print(f"| {name:<34} | {best * 1e3:8.3f} ms | {nbytes / best / 1e9:7.2f} GB/s | {n / best / 1e6:8.0f} Melem/s |")

    print(f"| {'kernel (1M float32, best run)':<34} | {'time':>11} | {'GB/s':>12} | {'':>15} |")
    print(f"|{'-' * 36}|{'-' * 13}|{'-' * 14}|{'-' * 17}|")
    run("add_f32_vv", lambda: ex["add_f32_vv"](store, x, z, y, n), 12 * n)
    for k in ("relu", "exp", "log", "tanh", "erf", "sigmoid", "silu", "gelu", "gelu_tanh", "sin"):
        run(f"{k}_f32", lambda k=k: ex[f"{k}_f32"](store, x, y, n), 8 * n)
    mem.write(store, struct.pack(f"<{n}f", *[rng.gauss(0, 1) for _ in range(n)]), z)   # activations ~ N(0, 1)
    for k in ("tanh", "erf", "gelu"):
        run(f"{k}_f32 on N(0, 1) data", lambda k=k: ex[f"{k}_f32"](store, z, y, n), 8 * n)
    run("softmax_f32 (2048, 512)", lambda: ex["softmax_f32"](store, x, y, 2048, 512, 1, 0), 8 * n)
    run("softmax_f32 (256, 64, 64) axis 1", lambda: ex["softmax_f32"](store, x, y, 256, 64, 64, 0), 8 * n)
    run("layer_norm_f32 (2048, 512)", lambda: ex["layer_norm_f32"](store, x, z, z, y, 2048, 512, 1e-5), 8 * n)
    run("sum_f32 rows (2048, 512)", lambda: ex["sum_f32"](store, x, y, 2048, 512, 1), 4 * n)
    run("sum_f32 columns (2048, 512)", lambda: ex["sum_f32"](store, x, y, 1, 2048, 512), 4 * n)
    run("max_f32 rows (2048, 512)", lambda: ex["max_f32"](store, x, y, 2048, 512, 1), 4 * n)
    return 0


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
    return statistics.median(times), min(times)


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
        tw, bw = timeit(lambda: fn(*xs), t_wasm)
        tp, _ = timeit(lambda: fn(*ps), t_py)
        rows.append((name, f"{nbytes / tw / 1e9:.2f} ({nbytes / bw / 1e9:.2f} best) GB/s, {tw * 1e3:.3f} ms",
                     f"{nbytes / tp / 1e9:.4f} GB/s", f"{tp / tw:.0f}x"))
    # per-op cost on tiny tensors: Python overhead (shape/dtype rules, wrappers, the call into wasm)
    small = [("add (16,) + (16,)", [(16,), (16,)], lambda a, b: a + b),
             ("add (4, 16) + (16,)", [(4, 16), (16,)], lambda a, b: a + b),
             ("exp (16,)", [(16,)], ember.exp), ("gelu (16,)", [(16,)], ember.gelu),
             ("softmax (4, 16)", [(4, 16)], ember.softmax), ("sum (4, 16) axis -1", [(4, 16)], lambda x: x.sum(axis=-1))]
    for name, shapes, fn in small:
        xs = [rand(s) for s in shapes]
        ps = [x.to("python") for x in xs]
        (tw, bw), (tp, _) = timeit(lambda: fn(*xs), t_wasm), timeit(lambda: fn(*ps), t_wasm)
        rows.append((name, f"{tw * 1e6:.1f} ({bw * 1e6:.1f} best) us per op", f"{tp * 1e6:.1f} us", f"{tp / tw:.1f}x"))
    rt = get_backend("wasm").rt
    from ember.wasm.runtime import R, W
    a, y = array("f", [0.0]) * 16, array("f", [0.0]) * 16
    tw, bw = timeit(lambda: rt.call("exp_f32", R(a, 16), W(y, 16), 16), t_wasm)
    rows.append(("rt.call('exp_f32') on 16 elements (no ember)", f"{tw * 1e6:.1f} ({bw * 1e6:.1f} best) us per call",
                 "-", "-"))

    width = max(len(r[0]) for r in rows)
    ww = max(len(r[1]) for r in rows)
    print(f"\n| {'case':<{width}} | {'wasm (median, best)':>{ww}} | {'python':>14} | python/wasm |")
    print(f"|{'-' * (width + 2)}|{'-' * (ww + 2)}|{'-' * 16}|-------------|")
    for name, w, p, r in rows:
        print(f"| {name:<{width}} | {w:>{ww}} | {p:>14} | {r:>11} |")
    return 0


if __name__ == "__main__":
    if sys.platform == "emscripten":
        _rc = guest_main(sys.argv[1:])
        if _rc:
            raise SystemExit(_rc)
    elif "--native" in sys.argv:
        raise SystemExit(native_main(sys.argv[1:]))
    else:
        raise SystemExit(host_main(sys.argv[1:]))
