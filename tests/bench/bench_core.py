"""CPU benchmark: ember's pure-Python backend next to its numpy backend and PyTorch (CPU, when
importable) on the same inputs, in one run. Prints one table of median wall times and ratios.

    python build.py bench core           # or: .venv/bin/python tests/bench/bench_core.py [--quick] [--threads N]

Cases: square matmul (64, 128, 256), conv2d on MNIST-sized inputs (1x1x28x28 1->16 3x3, and
1x16x14x14 16->32 3x3, both padding 1), and a small MNIST CNN forward pass built from ember's
functional ops (conv 1->16 3x3 pad 1, relu, maxpool 2, conv 16->32 3x3 pad 1, relu, maxpool 2,
linear 1568->128, relu, linear 128->10) on one 1x1x28x28 image; plus the MNIST demo model
(demos/mnist/model.py, with batch norm) when ember.nn is there to build it.

numpy's BLAS and PyTorch run on one thread unless ``--threads N`` says otherwise: the
pure-Python backend is single-threaded, so this compares per core, and on a shared machine
single-threaded timings stay steady where multi-threaded ones swing widely.

Then the ONNX section (tests/bench/bench_models.py builds the graphs with onnx.helper, so no
exporter is needed): ember next to onnxruntime (CPU, same thread count) and PyTorch (the same
computation in eager torch, where torch is installed) on the MNIST demo CNN at batch 1 and 64,
all-MiniLM-L6-v2 at 8 x 64 and 1 x 8 tokens (demos/minilm weights; ``python3 build.py site``
fetches them), a MobileNetV2-style CNN and a 2-layer "tiny" BERT (random weights), each eager
(``ember.onnx.load(..., compile=False)``) and compiled (replayed execution plans, the default,
when this ember has them), with ratios to onnxruntime and the per-node overhead of every
backend measured on a chain of 200 tiny nodes.

    .venv/bin/python tests/bench/bench_core.py --only onnx      # just that section (--only micro: the first)

Last, the held-out graphs section (``--only graphs``; two threads unless ``--threads N``): ember's
numpy backend against onnxruntime on graphs PyTorch exports (a MobileNetV3-small-style CNN at
224², a 4-layer pre-norm encoder at 8 x 32 x 128 and its int8 form from onnxruntime's
``quantize_dynamic``), PP-OCRv4's detector and recogniser and the MNIST demo CNN, runs
alternating, with the slowest ops of each side. torch comes from ``--torch-python PATH`` when
this interpreter has none (default: ../refvenv/bin/python beside the repository).

The whole bench runs with OpenBLAS's own kernel choice: ``OPENBLAS_CORETYPE`` and
``OPENBLAS_L2_SIZE`` are removed from this process's environment before numpy loads.

Every case runs once to warm up (caches, first-call costs), then repeatedly until at least
``MIN_TIME`` seconds and ``MIN_RUNS`` runs have passed (fewer for the slowest), and reports the
median. Ratios > 1 mean the left one is slower. The python/numpy/torch outputs are checked
against each other before timing, so a fast wrong answer does not show up as a win.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The bench's options (``--help`` prints them and exits before anything runs)."""
    p = argparse.ArgumentParser(
        prog="bench_core.py", description="ember CPU benchmark: the pure-Python and numpy backends next to "
        "PyTorch and onnxruntime (see the module docstring for the sections).")
    p.add_argument("--only", choices=("micro", "onnx", "graphs"), default=None,
                   help="run one section: micro (the first table), onnx, or graphs (the held-out graphs)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="BLAS / PyTorch / onnxruntime threads (default: 2 for --only graphs, else 1)")
    p.add_argument("--quick", action="store_true", help="fewer, shorter timing runs")
    p.add_argument("--graph", metavar="TEXT", default=None,
                   help="graphs section: only the graphs whose name contains TEXT (case-insensitive), e.g. MNIST")
    p.add_argument("--torch-python", metavar="PATH", default=None,
                   help="an interpreter with torch for exporting the held-out graphs "
                   "(default: this one if it has torch, else ../refvenv/bin/python beside the repository)")
    p.add_argument("--export-to", metavar="DIR", default=None,
                   help="(internal) export the PyTorch graphs into DIR and exit; run by the torch interpreter")
    args = p.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    return args


ARGS = parse_args(None if __name__ == "__main__" else [])
ONLY = ARGS.only
# the graphs section compares with onnxruntime on two threads (the setting) unless told
THREADS = ARGS.threads if ARGS.threads is not None else (2 if ONLY == "graphs" else 1)
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(THREADS)   # before numpy loads its BLAS
# OpenBLAS picks its own kernels here: these machines pin OPENBLAS_CORETYPE=Haswell and an
# OPENBLAS_L2_SIZE that slow numpy's BLAS (CI keeps them; a comparison with native peers must not)
OPENBLAS_UNSET = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if os.environ.pop(v, None) is not None]
EXPORTING = ARGS.export_to is not None     # run by an interpreter with torch and without ember

import numpy as np  # noqa: E402

if not EXPORTING:
    import ember  # noqa: E402

MIN_TIME = 1.0
MIN_RUNS = 5
MAX_RUNS = 200
QUICK = ARGS.quick
if QUICK:
    MIN_TIME, MIN_RUNS = 0.2, 3

try:
    import torch
    import torch.nn.functional as TF
    torch.set_grad_enabled(False)
    torch.set_num_threads(THREADS)
except ImportError:   # PyTorch is a peer when present, never a requirement
    torch = None


def median_time(fn) -> tuple:
    """(median wall time, median CPU time of this process) per call, in seconds."""
    fn()   # warm-up
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < MAX_RUNS:
        t, c = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
        if len(walls) >= MIN_RUNS and elapsed >= MIN_TIME:
            break
        if len(walls) >= 3 and elapsed >= 5 * MIN_TIME:   # the slow pure-Python matmuls
            break
    return statistics.median(walls), statistics.median(cpus)


def rnd(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- the cases: each gives numpy arrays, an ember function and a torch function --------------

def cnn_params(rng):
    return {"c1w": rnd(rng, 16, 1, 3, 3, scale=0.3), "c1b": rnd(rng, 16, scale=0.1),
            "c2w": rnd(rng, 32, 16, 3, 3, scale=0.1), "c2b": rnd(rng, 32, scale=0.1),
            "f1w": rnd(rng, 1568, 128, scale=0.03), "f1b": rnd(rng, 128, scale=0.1),
            "f2w": rnd(rng, 128, 10, scale=0.1), "f2b": rnd(rng, 10, scale=0.1)}


def cnn_ember(e, x, p):
    x = e.max_pool2d(e.relu(e.conv2d(x, p["c1w"], p["c1b"], padding=1)), 2)      # (1, 16, 14, 14)
    x = e.max_pool2d(e.relu(e.conv2d(x, p["c2w"], p["c2b"], padding=1)), 2)      # (1, 32, 7, 7)
    x = e.reshape(x, (x.shape[0], -1))                                          # (1, 1568)
    x = e.relu(e.add(e.matmul(x, p["f1w"]), p["f1b"]))                          # (1, 128)
    return e.add(e.matmul(x, p["f2w"]), p["f2b"])                               # (1, 10)


def cnn_torch(x, p):
    x = TF.max_pool2d(TF.relu(TF.conv2d(x, p["c1w"], p["c1b"], padding=1)), 2)
    x = TF.max_pool2d(TF.relu(TF.conv2d(x, p["c2w"], p["c2b"], padding=1)), 2)
    x = x.reshape(x.shape[0], -1)
    x = TF.relu(x @ p["f1w"] + p["f1b"])
    return x @ p["f2w"] + p["f2b"]


def cases():
    rng = np.random.default_rng(0)
    out = []
    for n in (64, 128, 256):
        a, b = rnd(rng, n, n), rnd(rng, n, n)
        out.append((f"matmul {n}x{n} @ {n}x{n}", {"a": a, "b": b},
                    lambda e, t: e.matmul(t["a"], t["b"]), lambda t: t["a"] @ t["b"]))
    x = rng.random((1, 1, 28, 28), dtype=np.float32)
    w, b = rnd(rng, 16, 1, 3, 3), rnd(rng, 16)
    out.append(("conv2d 1x1x28x28, 1->16 3x3 pad 1", {"x": x, "w": w, "b": b},
                lambda e, t: e.conv2d(t["x"], t["w"], t["b"], padding=1),
                lambda t: TF.conv2d(t["x"], t["w"], t["b"], padding=1)))
    x = rnd(rng, 1, 16, 14, 14)
    w, b = rnd(rng, 32, 16, 3, 3, scale=0.2), rnd(rng, 32)
    out.append(("conv2d 1x16x14x14, 16->32 3x3 pad 1", {"x": x, "w": w, "b": b},
                lambda e, t: e.conv2d(t["x"], t["w"], t["b"], padding=1),
                lambda t: TF.conv2d(t["x"], t["w"], t["b"], padding=1)))
    params = cnn_params(rng)
    params["x"] = rng.random((1, 1, 28, 28), dtype=np.float32)
    out.append(("small CNN forward, 1x1x28x28 (functional)", params,
                lambda e, t: cnn_ember(e, t["x"], t), lambda t: cnn_torch(t["x"], t)))
    return out


def demo_model_case():
    """The MNIST demo network (ember.nn), when ember.nn and the demo are there."""
    here = os.path.dirname(os.path.abspath(__file__))
    demo = os.path.join(here, "..", "..", "demos", "mnist")
    try:
        sys.path.insert(0, demo)
        import model as mnist   # demos/mnist/model.py
        nets = {d: mnist.load_model(os.path.join(demo, "mnist.safetensors"), device=d) for d in ("python", "numpy")}
    except Exception as exc:   # ember.nn not written yet, or the demo changed: say so, skip the row
        print(f"(MNIST demo model row skipped: {type(exc).__name__}: {exc})")
        return None
    finally:
        sys.path.remove(demo)
    img = np.random.default_rng(1).random((1, 1, 28, 28), dtype=np.float32)
    return nets, img


# ---- ONNX models: ember eager / compiled next to onnxruntime and PyTorch -----------------------

def interleaved(fns: dict, best: dict | None = None) -> dict:
    """Median wall time of each function, measured round-robin (one call of each per round), so
    that load changes on a shared machine hit every contender alike; ``best`` (if given) gets
    each one's fastest call."""
    for f in fns.values():
        f()                                   # warm-up
    times = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < MAX_RUNS:
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
        rounds += 1
        elapsed = time.perf_counter() - start
        if rounds >= MIN_RUNS and elapsed >= MIN_TIME * len(fns):
            break
        if rounds >= 3 and elapsed >= 5 * MIN_TIME * len(fns):
            break
    if best is not None:
        best.update({k: min(v) for k, v in times.items()})
    return {k: statistics.median(v) for k, v in times.items()}


def _onnx_cases():
    """(name, model bytes, feeds, torch fn or None, devices) for the ONNX section."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models as M
    rng = np.random.default_rng(0)
    out = []
    w = M.mnist_weights()
    raw = M.mnist_onnx(w)
    for n in (1, 64):
        x = rng.random((n, 1, 28, 28), dtype=np.float32)
        out.append((f"MNIST demo CNN, batch {n}", raw, {"x": x}, M.mnist_torch(w) if torch else None,
                    ("numpy", "python") if n == 1 else ("numpy",)))
    try:
        w = M.minilm_weights()
    except Exception as exc:   # the weights come with the site step
        print(f"(MiniLM rows skipped: {type(exc).__name__}: {exc}; `python3 build.py site` fetches the weights)")
    else:
        raw = M.bert_onnx(M.MINILM, w)
        for b, n in ((8, 64), (1, 8)):
            ids, mask = M.bert_inputs(M.MINILM, b, n)
            out.append((f"all-MiniLM-L6-v2, {b} x {n} tokens", raw, {"input_ids": ids, "attention_mask": mask},
                        M.bert_torch(M.MINILM, w) if torch else None, ("numpy",)))
    w = M.mobilenet_weights()
    out.append(("MobileNetV2-style CNN, 1x3x96x96", M.mobilenet_onnx(w),
                {"x": rng.random((1, 3, 96, 96), dtype=np.float32)}, M.mobilenet_torch(w) if torch else None,
                ("numpy",)))
    w = M.random_bert_weights(M.TINY_BERT)
    ids, mask = M.bert_inputs(M.TINY_BERT, 1, 16)
    out.append(("tiny BERT (2 layers, 128), 1 x 16 tokens", M.bert_onnx(M.TINY_BERT, w),
                {"input_ids": ids, "attention_mask": mask}, M.bert_torch(M.TINY_BERT, w) if torch else None,
                ("numpy", "python")))
    return out


def _has_plans() -> bool:
    import inspect
    import ember.onnx
    return hasattr(ember, "compile") and "compile" in inspect.signature(ember.onnx.load).parameters


def _ember_modes():
    return (("eager", False), ("compiled", True)) if _has_plans() else (("eager", None),)


def _load(raw, dev, compile_flag):
    import warnings
    import ember.onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if compile_flag is None:
            return ember.onnx.load(raw, device=dev)
        return ember.onnx.load(raw, device=dev, compile=compile_flag)


def _ort_session(raw):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])


def _nodes(raw) -> int:
    import onnx
    return len(onnx.load_from_string(raw).graph.node)


def onnx_section() -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        print("\n(ONNX section skipped: onnxruntime is not installed; `python3 build.py setup` installs it)")
        return
    modes = _ember_modes()
    print(f"\nONNX models: ember (numpy backend unless named) vs onnxruntime {ort.__version__} "
          + (f"and PyTorch {torch.__version__} " if torch else "")
          + f"on {THREADS} thread(s); median ms per call; ratio = ember / onnxruntime")
    if not _has_plans():
        print("(this ember has no execution plans yet: only the eager column)")
    print("(nodes: in the file / run after ember's load-time folding and fusion)")
    if torch is None:
        print("(PyTorch column empty: torch is not installed. `.venv/bin/pip install torch` (a CPU build) adds it)")
    rows = []
    for name, raw, feeds, tfn, devices in _onnx_cases():
        sess = _ort_session(raw)
        ref = sess.run(None, feeds)[0]
        fns = {"ort": lambda: sess.run(None, feeds)}
        if tfn is not None:
            tf = [torch.from_numpy(v) for v in feeds.values()]
            r = tfn(*tf).numpy()
            if not np.allclose(r, ref, rtol=1e-3, atol=1e-3):
                raise SystemExit(f"{name}: the PyTorch peer differs from onnxruntime (max err {np.abs(r - ref).max():.3g})")
            fns["torch"] = lambda: tfn(*tf)
        meta = {}
        for dev in devices:
            ts = [ember.from_numpy(v, device=dev) for v in feeds.values()]
            for mode, flag in modes:
                m = _load(raw, dev, flag)
                y = m(*ts)
                err = float(np.abs(y.numpy() - ref).max())
                if err > 1e-3 * max(1.0, float(np.abs(ref).max())):
                    raise SystemExit(f"{name} on {dev} ({mode}): differs from onnxruntime by {err:.3g}")
                fns[(dev, mode)] = (lambda m=m, ts=ts: m(*ts))
                meta[dev] = (len(getattr(m, "_plan", m.graph.nodes)), err)   # nodes run after load-time rewrites
        t = interleaved(fns)
        for dev in devices:
            ran, err = meta[dev]
            label = name if dev == "numpy" else f"{name} [{dev}]"
            rows.append((label, {mode: t[(dev, mode)] for mode, _ in modes}, t["ort"],
                         t.get("torch") if dev == "numpy" else None, f"{_nodes(raw)}/{ran}", err))
    head = (f"{'model':<48} {'nodes':>7} {'onnxrt':>8} {'torch':>8} "
            + " ".join(f"{'ember ' + m:>14}" for m, _ in modes) + " "
            + " ".join(f"{m + '/ort':>12}" for m, _ in modes) + f" {'torch/ort':>9} {'max err':>8}")
    print(head)
    print("-" * len(head))
    for label, res, t_ort, t_torch, nodes, err in rows:
        cells = " ".join(f"{res[m] * 1e3:>14.3f}" for m, _ in modes)
        ratios = " ".join(f"{res[m] / t_ort:>11.1f}x" for m, _ in modes)
        tt = f"{t_torch * 1e3:>8.3f}" if t_torch else f"{'-':>8}"
        tr = f"{t_torch / t_ort:>8.1f}x" if t_torch else f"{'-':>9}"
        print(f"{label:<48} {nodes:>7} {t_ort * 1e3:>8.3f} {tt} {cells} {ratios} {tr} {err:>8.1e}")
    overhead_table(modes)


def overhead_table(modes, n=200) -> None:
    """Wall time per node of a chain of ``n`` Add/Mul/Relu nodes on 8 floats: what each runtime
    spends per node when the arithmetic costs nothing."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models as M
    raw = M.chain_onnx(n)
    x = np.ones((1, 8), np.float32)
    sess = _ort_session(raw)
    ref = sess.run(None, {"x": x})[0]
    fns = {"onnxruntime": lambda: sess.run(None, {"x": x})}
    if torch is not None:
        tfn, tx = M.chain_torch(n), torch.from_numpy(x)
        fns["torch eager"] = lambda: tfn(tx)
    for dev in [d for d in ember.devices() if d != "webgpu"]:
        ex = ember.from_numpy(x, device=dev)
        for mode, flag in modes:
            m = _load(raw, dev, flag)
            if not np.allclose(m(ex).numpy(), ref, rtol=1e-5, atol=1e-6):
                raise SystemExit(f"overhead chain on {dev} ({mode}) differs from onnxruntime")
            fns[f"ember {dev} {mode}"] = (lambda m=m, ex=ex: m(ex))
    cols = list(interleaved(fns).items())
    print(f"\nper-node overhead: a chain of {n} tiny nodes (Add/Mul/Relu on 8 floats), microseconds per node")
    for label, t in cols:
        print(f"  {label:<28} {t / n * 1e6:>8.2f} us/node   ({t * 1e3:.3f} ms per call)")

# ---- held-out graphs exported with PyTorch: ember numpy vs onnxruntime, per-op profiles -------
#
# ``--only graphs`` (two threads unless ``--threads``): a MobileNetV3-style CNN at 224², a 4-layer
# pre-norm transformer encoder (8 x 32 x 128) and the same encoder int8 (onnxruntime's
# ``quantize_dynamic``), PP-OCRv4's detector and recogniser (rapidocr-onnxruntime's files) and
# the MNIST demo CNN. The PyTorch graphs are exported once by an interpreter that has torch
# (this one, or ``--torch-python PATH``; default ../refvenv/bin/python next to the repository)
# into ~/.cache/ember/bench_core/, random weights from a fixed seed. Runs alternate (ember,
# onnxruntime, ember, ...), onnxruntime's intra-op threads do not spin, and the slowest ops of
# each side are listed (ember: the replayed plan's kernels timed one by one; onnxruntime: its
# profiler's node events).

GRAPHS_VERSION = 1
GRAPH_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "ember", "bench_core", f"graphs-v{GRAPHS_VERSION}")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def export_graphs(folder: str) -> None:
    """Export the PyTorch graphs into ``folder`` (runs where torch is importable)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)

    def bn(c):
        b = nn.BatchNorm2d(c)
        with torch.no_grad():        # non-trivial statistics, so folding them matters
            b.running_mean.uniform_(-0.2, 0.2)
            b.running_var.uniform_(0.5, 1.5)
            b.weight.uniform_(0.5, 1.5)
            b.bias.uniform_(-0.2, 0.2)
        return b

    def div8(v):
        return max(8, int(v + 4) // 8 * 8)

    class ConvBN(nn.Sequential):
        def __init__(self, cin, cout, k, s=1, groups=1, act=None):
            layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), bn(cout)]
            if act is not None:
                layers.append(act())
            super().__init__(*layers)

    class SE(nn.Module):
        def __init__(self, c):
            super().__init__()
            mid = div8(c // 4)
            self.fc1, self.fc2 = nn.Conv2d(c, mid, 1), nn.Conv2d(mid, c, 1)

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))

    class Block(nn.Module):
        def __init__(self, cin, k, exp, cout, se, act, s):
            super().__init__()
            layers = [] if exp == cin else [ConvBN(cin, exp, 1, act=act)]
            layers.append(ConvBN(exp, exp, k, s, groups=exp, act=act))
            if se:
                layers.append(SE(exp))
            layers.append(ConvBN(exp, cout, 1))
            self.body, self.res = nn.Sequential(*layers), s == 1 and cin == cout

        def forward(self, x):
            y = self.body(x)
            return x + y if self.res else y

    class MobileNetV3Small(nn.Module):        # torchvision's mobilenet_v3_small layout
        CFG = [(3, 16, 16, True, nn.ReLU, 2), (3, 72, 24, False, nn.ReLU, 2), (3, 88, 24, False, nn.ReLU, 1),
               (5, 96, 40, True, nn.Hardswish, 2), (5, 240, 40, True, nn.Hardswish, 1),
               (5, 240, 40, True, nn.Hardswish, 1), (5, 120, 48, True, nn.Hardswish, 1),
               (5, 144, 48, True, nn.Hardswish, 1), (5, 288, 96, True, nn.Hardswish, 2),
               (5, 576, 96, True, nn.Hardswish, 1), (5, 576, 96, True, nn.Hardswish, 1)]

        def __init__(self):
            super().__init__()
            layers, c = [ConvBN(3, 16, 3, 2, act=nn.Hardswish)], 16
            for k, exp, out, se, act, s in self.CFG:
                layers.append(Block(c, k, exp, out, se, act, s))
                c = out
            layers.append(ConvBN(c, 576, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Linear(1024, 1000))

        def forward(self, x):
            return self.head(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))

    class EncoderLayer(nn.Module):            # pre-norm: x + attn(ln(x)), x + mlp(ln(x))
        def __init__(self, d=128, heads=4, ff=512):
            super().__init__()
            self.h = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.h) ** -0.5, dim=-1) @ v   # (b, h, t, dh)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class Encoder(nn.Module):
        def __init__(self, layers=4, d=128):
            super().__init__()
            self.layers = nn.Sequential(*[EncoderLayer(d) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)

        def forward(self, x):
            return self.ln(self.layers(x))

    os.makedirs(folder, exist_ok=True)
    for name, model, shape in (("mobilenetv3_small", MobileNetV3Small(), (1, 3, 224, 224)),
                               ("encoder4", Encoder(), (8, 32, 128))):
        model.eval()
        kw = {"dynamo": False} if "dynamo" in torch.onnx.export.__code__.co_varnames else {}
        tmp = os.path.join(folder, name + ".onnx.part")
        torch.onnx.export(model, (torch.randn(*shape),), tmp, opset_version=17, input_names=["x"],
                          output_names=["y"], do_constant_folding=True, **kw)
        os.replace(tmp, os.path.join(folder, name + ".onnx"))


def _torch_python() -> str | None:
    if ARGS.torch_python:
        return ARGS.torch_python
    if torch is not None:
        return sys.executable
    ref = os.path.join(os.path.dirname(ROOT), "refvenv", "bin", "python")
    return ref if os.path.exists(ref) else None


def ensure_graphs() -> str | None:
    """The folder holding the exported graphs (exported now if missing), or None with the reason printed."""
    import subprocess
    done = os.path.join(GRAPH_CACHE, "encoder4_int8.onnx")
    if os.path.exists(done):
        return GRAPH_CACHE
    py = _torch_python()
    if py is None:
        print("(PyTorch graphs skipped: no interpreter with torch; pass --torch-python PATH, e.g. a venv made with "
              "`python3 -m venv ../refvenv && ../refvenv/bin/pip install torch onnx`)")
        return None
    if not os.path.exists(os.path.join(GRAPH_CACHE, "encoder4.onnx")):
        try:
            r = subprocess.run([py, os.path.abspath(__file__), "--export-to", GRAPH_CACHE], capture_output=True,
                               text=True)
        except OSError as exc:
            print(f"(PyTorch graphs skipped: cannot run {py}: {exc})")
            return None
        if r.returncode:
            print(f"(PyTorch graphs skipped: the export with {py} failed:\n{r.stderr[-2000:]})")
            return None
    from onnxruntime.quantization import QuantType, quantize_dynamic
    tmp = done + ".part.onnx"
    # reduce_range (7-bit weights): onnxruntime's AVX2 u8s8 kernels sum pairs of products in
    # saturating int16, so with full-range int8 weights its own results leave the exact ones
    # (tests/test_onnx_quant.py); the graph is the same either way
    quantize_dynamic(os.path.join(GRAPH_CACHE, "encoder4.onnx"), tmp, weight_type=QuantType.QInt8, reduce_range=True)
    os.replace(tmp, done)
    return GRAPH_CACHE


def _graph_cases():
    """(name, model bytes, feeds, error tolerance relative to the output's largest magnitude)."""
    rng = np.random.default_rng(0)
    out = []
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_models as M
    out.append(("MNIST demo CNN, 1x1x28x28", M.mnist_onnx(M.mnist_weights()),
                {"x": rng.random((1, 1, 28, 28), dtype=np.float32)}, 1e-4))
    folder = ensure_graphs()
    if folder is not None:
        def read(name):
            with open(os.path.join(folder, name), "rb") as f:
                return f.read()
        out.append(("MobileNetV3-small-style CNN, 1x3x224x224", read("mobilenetv3_small.onnx"),
                    {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}, 1e-4))
        enc = {"x": rng.standard_normal((8, 32, 128)).astype(np.float32)}
        out.append(("pre-norm encoder, 4 layers, 8x32x128", read("encoder4.onnx"), enc, 1e-4))
        # int8: a 1-step difference in a dynamically quantized activation moves outputs by a
        # quantization step; ember follows onnxruntime's rounding, so this stays small
        out.append(("same encoder, int8 (quantize_dynamic)", read("encoder4_int8.onnx"), enc, 2e-2))
    try:
        import rapidocr_onnxruntime
    except ImportError:
        print("(PP-OCRv4 rows skipped: rapidocr-onnxruntime is not installed)")
    else:
        models = os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models")
        for name, file, shape in (("PP-OCRv4 detector, 1x3x480x640", "ch_PP-OCRv4_det_infer.onnx", (1, 3, 480, 640)),
                                  ("PP-OCRv4 recogniser, 1x3x48x320", "ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320))):
            with open(os.path.join(models, file), "rb") as f:
                raw = f.read()
            out.append((name, raw, {"x": rng.random(shape, dtype=np.float32)}, 1e-3))
    return out


def _ort_session_quiet(raw, profile=False):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        import tempfile
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="ember-bench-"), "ort")
    return ort.InferenceSession(raw, so, providers=["CPUExecutionProvider"])


def _fastest(runs: list) -> dict:
    """{name: seconds}: each step's fastest time over the runs (lists of (name, seconds) in the
    same order), summed per name. On a loaded machine a step's mean is mostly time spent waiting
    for a core; its fastest run is what the step itself costs."""
    out: dict = {}
    for i, (name, _) in enumerate(runs[0]):
        out[name] = out.get(name, 0.0) + min(r[i][1] for r in runs if i < len(r))
    return out


def ort_profile(raw, feeds, runs: int) -> dict:
    """{op type: seconds}: each node's fastest time over ``runs`` runs in onnxruntime's profiler,
    summed per op type."""
    import json
    sess = _ort_session_quiet(raw, profile=True)
    sess.run(None, feeds)
    path = sess.end_profiling()
    sess = _ort_session_quiet(raw, profile=True)
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    best: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            key = (e.get("args", {}).get("op_name", "?"), e["name"])
            best[key] = min(best.get(key, float("inf")), e["dur"] * 1e-6)
    out: dict = {}
    for (op, _), v in best.items():
        out[op] = out.get(op, 0.0) + v
    return out


def ember_profile(model, tensors, runs: int) -> dict:
    """{kernel name: seconds}: the replayed plan's kernels timed one by one, each kernel call's
    fastest time over ``runs`` runs, summed per name (a backend's compiled replay that offers
    ``profile(inputs, times, steps)`` times its own steps)."""
    from ember import plan as P
    pl = model._compiled.plan_for(*tensors) if model._compiled is not None else None
    if pl is None:
        return {"(eager: no plan to profile)": 0.0}
    fast = pl.fast if pl.fast is not None else P._compiled_replay(pl)
    all_runs = []
    for _ in range(runs):
        steps: list = []
        all_runs.append(steps)
        if fast is not False and hasattr(fast, "profile"):
            fast.profile(list(tensors), {}, steps)
            continue
        wrap = ember.Tensor._wrap
        vals = [None] * pl.n_slots
        vals[:pl.n_inputs] = tensors
        for s, t in pl.consts:
            vals[s] = t
        for step, (kernel, ins, o, meta, attrs, dev, multi, free) in zip(pl.steps, pl._program):
            t0 = time.perf_counter()
            if multi is False:
                vals[o] = wrap(kernel(meta, *[vals[i] for i in ins], **attrs), meta.shape, meta.dtype, dev)
            elif multi is True:
                for s, b, m in zip(o, kernel(meta, *[vals[i] for i in ins], **attrs), meta):
                    vals[s] = wrap(b, m.shape, m.dtype, dev)
            else:
                kernel(vals)
            steps.append((step.name, time.perf_counter() - t0))
            for s in free:
                vals[s] = None
    return _fastest(all_runs)


def _top(prof: dict, n: int) -> list:
    return sorted(prof.items(), key=lambda kv: -kv[1])[:n]


def graphs_section() -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        print("\n(graphs section skipped: onnxruntime is not installed; `python3 build.py setup` installs it)")
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nheld-out graphs: ember numpy (compiled plan) vs onnxruntime {ort.__version__}, {THREADS} threads each, "
          f"runs alternating, onnxruntime spinning off; OpenBLAS picks its kernels"
          f"{' (unset: ' + ', '.join(OPENBLAS_UNSET) + ')' if OPENBLAS_UNSET else ''}; load average {load:.1f}")
    rows = []
    for name, raw, feeds, tol in _graph_cases():
        if ARGS.graph is not None and ARGS.graph.lower() not in name.lower():
            continue
        sess = _ort_session_quiet(raw)
        ref = sess.run(None, feeds)[0]
        m = _load(raw, "numpy", True)
        ts = [ember.from_numpy(v, device="numpy") for v in feeds.values()]
        err = float(np.abs(m(*ts).numpy() - ref).max()) / max(1.0, float(np.abs(ref).max()))
        if err > tol:
            raise SystemExit(f"{name}: ember differs from onnxruntime by {err:.3g} (relative to the largest output)")
        best: dict = {}
        t = interleaved({"ember": lambda: m(*ts), "ort": lambda: sess.run(None, feeds)}, best)
        runs = max(5, min(20, int(1.0 / max(t["ember"], 1e-4))))
        rows.append((name, t["ember"], t["ort"], err, ember_profile(m, ts, runs), ort_profile(raw, feeds, runs),
                     best["ember"], best["ort"]))
    print("(median of alternating runs; 'best': each side's fastest run, what a quiet machine gives)")
    head = (f"{'graph':<44} {'ember ms':>9} {'onnxrt ms':>9} {'ember/ort':>9} {'best e/o':>9} {'best ms e/o':>15} "
            f"{'max err':>8}")
    print(head)
    print("-" * len(head))
    for name, te, to, err, _, _, be, bo in rows:
        print(f"{name:<44} {te * 1e3:>9.2f} {to * 1e3:>9.2f} {te / to:>8.2f}x {be / bo:>8.2f}x "
              f"{be * 1e3:>7.2f}/{bo * 1e3:<7.2f} {err:>8.1e}")
    print(f"(load average now {os.getloadavg()[0]:.1f})" if hasattr(os, "getloadavg") else "")
    print("\nslowest ops per graph (ms per run, each step's fastest of the profiled runs, summed per op; ember: plan "
          "kernels timed one by one, onnxruntime: profiler node times)")
    for name, te, to, _, pe, po, _, _ in rows:
        print(f"  {name}")
        le, lo = _top(pe, 8), _top(po, 8)
        for i in range(max(len(le), len(lo))):
            a = f"{le[i][0]:<30} {le[i][1] * 1e3:>7.2f}" if i < len(le) else " " * 38
            b = f"{lo[i][0]:<26} {lo[i][1] * 1e3:>7.2f}" if i < len(lo) else ""
            print(f"    {a}   | {b}")


def main() -> int:
    print(f"ember bench core: CPython {platform.python_version()} on {platform.machine()}, "
          f"{os.cpu_count()} CPUs, peers on {THREADS} thread(s); numpy {np.__version__}; "
          + (f"torch {torch.__version__}" if torch else "torch not installed"))
    import ember.native
    nat = ember.native.info()
    print("numpy backend's native kernels (ember.native): " + ("in use" if nat["available"] else
          f"NOT in use ({nat['reason']}): the numpy paths run") + ("" if not nat["available"] else
          "; wasm quant kernels " + str(nat.get("wasm_kernels"))))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"median wall time per call (ms); ratio = left / right; load average {load:.1f} "
          f"(other processes on a loaded machine inflate wall times, multi-threaded peers most)\n")
    only = ONLY
    if only == "onnx":
        onnx_section()
        return 0
    if only == "graphs":
        graphs_section()
        return 0
    rows = []
    for name, arrays, efn, tfn in cases():
        times = {}
        results = {}
        for dev in ("python", "numpy"):
            ts = {k: ember.from_numpy(v, device=dev) for k, v in arrays.items()}
            results[dev] = efn(ember, ts).numpy()
            times[dev], cpu = median_time(lambda: efn(ember, ts))
            if dev == "python":
                times["python_cpu"] = cpu
        if torch is not None:
            tt = {k: torch.from_numpy(v) for k, v in arrays.items()}
            results["torch"] = tfn(tt).numpy()
            times["torch"] = median_time(lambda: tfn(tt))[0]
        ref = results.get("torch", results["numpy"])
        for dev, r in results.items():
            if not np.allclose(r, ref, rtol=1e-3, atol=1e-3):
                raise SystemExit(f"{name}: {dev} result differs from the reference (max err {np.abs(r - ref).max():.3g})")
        rows.append((name, times))
    demo = demo_model_case()
    if demo is not None:
        nets, img = demo
        times = {}
        for dev, net in nets.items():
            x = ember.from_numpy(img, device=dev)
            times[dev], cpu = median_time(lambda: net(x))
            if dev == "python":
                times["python_cpu"] = cpu
        rows.append(("MNIST demo model forward (ember.nn, with BN)", times))

    head = (f"{'case':<46} {'python':>10} {'(cpu)':>8} {'numpy':>9} {'torch':>9} {'python/numpy':>13} "
            f"{'numpy/torch':>12}")
    print(head)
    print("-" * len(head))
    for name, t in rows:
        py, nu, tor = t["python"], t["numpy"], t.get("torch")
        tor_ms = f"{tor * 1e3:.3f}" if tor else "-"
        ratio = f"{nu / tor:.1f}x" if tor else "-"
        print(f"{name:<46} {py * 1e3:>10.2f} {t['python_cpu'] * 1e3:>8.2f} {nu * 1e3:>9.3f} {tor_ms:>9} "
              f"{py / nu:>12.0f}x {ratio:>12}")
    print("\n(cpu) = CPU time of the pure-Python run: what its wall time is on an idle core")
    if only != "micro":
        onnx_section()
        # on two threads (the peers' setting there), in a process of its own: the BLAS thread
        # count is fixed when numpy loads
        import subprocess
        extra = ["--quick"] if QUICK else []
        if ARGS.torch_python:
            extra += ["--torch-python", ARGS.torch_python]
        subprocess.run([sys.executable, os.path.abspath(__file__), "--only", "graphs", *extra])
    return 0


if __name__ == "__main__":
    if EXPORTING:
        export_graphs(ARGS.export_to)
        sys.exit(0)
    sys.exit(main())
