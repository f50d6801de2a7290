"""In-page benchmark: ember in Pyodide (backends webgpu, wasm -- also with its wasm thread pool of
1 and of all threads once ``ember.wasm.set_threads`` exists --, python) next to onnxruntime-web
(wasm with 1, 2 and all threads, webgpu) in one headless Chromium run, same models, same inputs;
then the start-up rows and the LLM issue's in-page decode figures.

    python build.py bench web             # or: .venv/bin/python tests/bench/bench_web.py [options]
    python build.py bench web --quick     # smoke test: MNIST only, 1 run, ort wasm vs ember cpu
    python build.py bench web --start-only          # only page open -> first MNIST answer

Start-up (``--start-only``, skipped with ``--no-start``): for ember wasm and onnxruntime-web
(1 thread, all threads), one fresh browser profile on disk each, MNIST: the page is opened
``--start-visits`` times (default 3); visit 1 is a first visit, the others revisits with the
HTTP cache, the Cache API and V8's code cache kept (the server caches like ember.web: ETags,
long caching for /pyodide/ and ?v= URLs). Each visit reports page open -> engine ready -> model
loaded -> first answer; ember runs with its memory snapshots on (wasm/snapshot.js: a first visit
restores the site's prebuilt one when the site has it -- web/site.py makes it at build time -- and
keeps a copy in the Cache API, else boots normally and makes one in the background after its
answer; revisits restore the stored one) and says which way it booted.
The timed columns run with snapshots off, so no background work competes with them.

Workloads: the MNIST demo CNN (demos/mnist/model.py + mnist.safetensors) at batch 1, and
all-MiniLM-L6-v2 (demos/minilm/model.py + the page's float16-rounded weights, widened to float32)
on one 8-token sentence and on 8 sentences x 64 tokens (no padding), sentence embeddings out.
onnxruntime-web gets ONNX files of exactly these models with the same weights, built and checked
against ember by tests/bench/web/make_onnx.py into tests/bench/web/cache/ (gitignored).

Each engine runs in a fresh browser context (empty HTTP cache and storage) per model: the page
opens, boots its engine (for ember: Pyodide, the wheel install, the backend's init), downloads
the model, runs the first workload once (that moment, since navigation start, is the cold
start), warms up (a few runs; for MNIST on every wasm engine, onnxruntime-web's and ember's alike,
also at least 1 s of runs: V8 tiers the page's code up over ~0.3-0.5 s of calls) and then times
repeated runs (the median is reported; MNIST on the wasm engines in samples of 10 runs timed
together, as the page's clock ticks in 5 us steps; the repetition count
stops early at a per-workload time budget, after at least 3 runs; on webgpu, which is SwiftShader
here, MiniLM 8x64 gets one timed run after the first: about a minute each). ember's webgpu runs
with matmul autotune off as both demo pages do (``--autotune`` keeps it on). The pure-Python backend runs
MiniLM 1x8 twice after the cold run and MiniLM 8x64 not at all (about 270 s a run here;
``--python-minilm8`` runs it once). Outputs are compared with onnxruntime-web wasm 1-thread
(the ratio baseline) and with ember's numpy backend natively.

Output: a markdown table printed and written to tests/bench/web/results.md, a chart
tests/bench/web/results.png (drawn as SVG and rendered by the same Chromium), the raw numbers
in tests/bench/web/cache/results.json. ``--quick`` writes to tests/bench/web/cache/quick/ so a
smoke run never overwrites the committed report. The backend "wasm" shows as n/a (with the
reason) until ember's WebAssembly backend is in the wheel; then it is measured like the others.

Serves the built site (``build.py site``, rebuilt here unless ``--site DIR`` or $EMBER_SITE
names one) plus the bench page, onnxruntime-web's files and the cache from a small threaded
http.server on 127.0.0.1 with COOP/COEP headers (onnxruntime-web's threads need them).
onnxruntime-web itself is installed here (npm, pinned 1.30.0 in tests/bench/web/package.json)
into tests/bench/web/node_modules when it is missing.
"""
from __future__ import annotations

import argparse
import html
import tempfile
import json
import os
import platform
import shutil
import sys
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
WEB = HERE / "web"
REPO = HERE.parents[1]
CACHE = WEB / "cache"
ORT_VERSION = "1.30.0"
ORT_DIR = WEB / "node_modules" / "onnxruntime-web"

sys.path.insert(0, str(WEB))
if str(HERE) not in sys.path:      # loaded by path: browser_bench.py is beside it
    sys.path.insert(0, str(HERE))
import make_onnx  # noqa: E402
from browser_bench import (chromium, chromium_args, given_site, launch, load_module, log_panels,  # noqa: E402
                           npm_package, reason, screenshot_svg, serve, svg_document, wait_result, watched_page)


def log(msg: str) -> None:
    print(f"[bench web] {msg}", flush=True)


# ---- what runs --------------------------------------------------------------------------------

# (id, engine, backend, threads, label). The first is the ratio baseline. threads: onnxruntime's
# wasm threads, or the size of ember's wasm thread pool (ember.wasm.set_threads, issue 19 part 2:
# "n/a" while the wheel has none); -1 = navigator.hardwareConcurrency, 0 = the engine's default.
ENGINES = [
    ("ort-wasm-1t", "ort", "wasm", 1, "onnxruntime-web wasm, 1 thread"),
    ("ort-wasm-2t", "ort", "wasm", 2, "onnxruntime-web wasm, 2 threads"),
    ("ort-wasm-all", "ort", "wasm", -1, "onnxruntime-web wasm, all threads"),
    ("ort-webgpu", "ort", "webgpu", 1, "onnxruntime-web webgpu"),
    ("ember-webgpu", "ember", "webgpu", 0, "ember webgpu"),
    ("ember-wasm", "ember", "wasm", 0, "ember wasm (SIMD)"),
    ("ember-wasm-pool1", "ember", "wasm", 1, "ember wasm, thread pool of 1"),
    ("ember-wasm-poolall", "ember", "wasm", -1, "ember wasm, thread pool of all threads"),
    ("ember-python", "ember", "python", 0, "ember python"),
]
# The engines whose warm-up lasts WARMUP_S too and whose MNIST runs are timed in samples of BLOCK
# runs: every wasm engine, onnxruntime-web's and ember's alike (webgpu here is SwiftShader, ~10 ms
# a MNIST run, and the pure-Python backend has no tier-up to wait for).
FULL_WARMUP_ENGINES = {"ort-wasm-1t", "ort-wasm-2t", "ort-wasm-all", "ember-wasm", "ember-wasm-pool1",
                       "ember-wasm-poolall"}
# Start-up: page open -> first MNIST answer on a first visit (a fresh browser profile) and on the
# revisits that follow in the same profile (HTTP cache, Cache API, V8's code cache kept).
START_ENGINES = ["ort-wasm-1t", "ort-wasm-all", "ember-wasm"]
START_VISITS = 3
BASELINE = "ort-wasm-1t"
WORKLOADS = {   # name: (model, label)
    "mnist": ("mnist", "MNIST CNN, batch 1"),
    "minilm1": ("minilm", "MiniLM-L6, 1 x 8 tokens"),
    "minilm8": ("minilm", "MiniLM-L6, 8 x 64 tokens"),
}
# name: (warm-up runs, timed runs at most, at least, time budget in s for the timed runs: no new
# run starts past it once the least number is done)
PLAN_FULL = {"mnist": (5, 200, 30, 10), "minilm1": (2, 20, 3, 15), "minilm8": (1, 5, 3, 30)}
# The warm-up also lasts at least this long (s), the same for every engine: V8 tiers a page's
# hot code up over its first ~0.3-0.5 s of calls (Liftoff -> TurboFan for the wasm, and the JS
# around it). With 5 warm-up runs, a MNIST forward's first ~15-20 timed runs were still twice
# as slow as the later ones on both engines, so the median measured how far each engine's
# tier-up had come after ~1 ms of calls rather than its speed.
WARMUP_S = {"mnist": 1.0}
# Runs per timed sample (the same engines): a MNIST run is ~0.1 ms and a page's performance.now()
# ticks in 5 us steps (cross-origin isolated Chromium), so a run timed alone reads 95, 100 or 105
# us and medians tie; a sample of 10 runs timed together gives each run's mean to 0.5 us. The
# median is then over the samples (200 runs: 20 samples).
BLOCK = {"mnist": 10}
# WebGPU is SwiftShader here (a CPU adapter): MiniLM 8x64 takes ~50-60 s a run on either engine.
PLAN_WEBGPU = dict(PLAN_FULL, mnist=(5, 50, 3, 10), minilm1=(1, 20, 3, 10), minilm8=(0, 3, 1, 40))
PLAN_PYTHON = {"mnist": (1, 10, 3, 5), "minilm1": (0, 2, 2, 60), "minilm8": (0, 0, 0, 0)}
PLAN_QUICK = {"mnist": (1, 1, 1, 5), "minilm1": (0, 1, 1, 5), "minilm8": (0, 1, 1, 5)}
QUICK_ENGINES = ["ort-wasm-1t", "ember-wasm", "ember-python"]
QUICK_START_ENGINES = ["ort-wasm-1t", "ember-wasm"]


def plan_for(engine_id: str, workloads, a) -> list:
    steps = []
    for name in workloads:
        if a.quick:
            warm, reps, least, budget = PLAN_QUICK[name]
        elif engine_id == "ember-python":
            if name == "minilm8" and not a.python_minilm8:
                continue
            warm, reps, least, budget = PLAN_PYTHON[name]
        elif engine_id.endswith("webgpu"):
            warm, reps, least, budget = PLAN_WEBGPU[name]
        else:
            warm, reps, least, budget = PLAN_FULL[name]
        if a.reps is not None:
            reps = min(reps, a.reps)
        full = not a.quick and engine_id in FULL_WARMUP_ENGINES
        warm_s = WARMUP_S.get(name, 0.0) if full else 0.0
        block = BLOCK.get(name, 1) if full else 1
        steps.append({"name": name, "warmup": warm, "warmup_s": warm_s, "reps": reps, "min_reps": min(least, reps),
                      "budget_s": budget, "block": block})
    return steps


# ---- inputs -----------------------------------------------------------------------------------

SENTENCE_1X8 = "A man plays the guitar."       # [CLS] + 6 pieces + [SEP] = 8 tokens
# Eight texts, each followed by the next one and cut to exactly 64 tokens with [CLS] and [SEP].
TEXTS_8X64 = [
    "The river rose through the night, and by morning the low fields along the valley were under "
    "brown water; farmers moved their animals to the hills while volunteers stacked sandbags around "
    "the old mill, the school and the bridge that connects the two halves of the village.",
    "Compilers translate source code in several passes: the parser builds a tree, semantic analysis "
    "checks names and types, optimisation rewrites the intermediate form to remove redundant work, "
    "and the back end chooses instructions and registers for the target machine before emitting it.",
    "She bought fresh bread, two kinds of cheese, a bag of apples and a bottle of olive oil at the "
    "Saturday market, then walked home along the canal, stopping at the bookshop on the corner to "
    "ask whether the novel she had ordered three weeks earlier had finally arrived from the publisher.",
    "Migrating birds navigate thousands of kilometres using the position of the sun, the patterns of "
    "the stars, the Earth's magnetic field and familiar landmarks; young birds on their first journey "
    "often follow older ones, learning the route that their species has used for many generations.",
    "The committee reviewed the budget for the coming year, approved new funding for the public "
    "library and the swimming pool, postponed the decision about the parking garage until the spring, "
    "and asked the city engineers to prepare a report on the condition of the roads in the north district.",
    "A good cup of coffee depends on the beans, the grind, the water temperature and the brewing time; "
    "too fine a grind or too long an extraction makes it bitter, while water that is not hot enough "
    "leaves it thin and sour, so baristas weigh and time every step of the process.",
    "After the match the coach said the team had defended well in the first half but lost focus after "
    "the break, conceding two goals from set pieces; she promised more training on corners and free "
    "kicks before next week's game against the league leaders, who have not lost at home all season.",
    "Glaciers form where more snow falls in winter than melts in summer; over centuries the snow is "
    "compressed into dense ice that flows slowly downhill under its own weight, carving deep valleys, "
    "carrying rocks for great distances and leaving behind lakes and ridges when it finally retreats.",
]


def make_inputs() -> dict:
    """The workloads' inputs (both engines read this file): one MNIST test digit, and MiniLM
    token ids made by the demo's own tokenizer."""
    digits = json.loads((REPO / "demos" / "mnist" / "testdigits.json").read_text())
    pixels = [b / 255.0 for b in bytes.fromhex(digits["images_hex"][0])]
    tok_mod = load_module(REPO / "demos" / "minilm" / "tokenizer.py", "bench_minilm_tokenizer")
    tok = tok_mod.Tokenizer.from_file(REPO / "demos" / "minilm" / "vocab.txt")
    one = tok.encode(SENTENCE_1X8)
    if len(one) != 8:
        raise SystemExit(f"bench: {SENTENCE_1X8!r} is {len(one)} tokens, not 8")
    rows = []
    texts = [f"{t} {TEXTS_8X64[(i + 1) % len(TEXTS_8X64)]}" for i, t in enumerate(TEXTS_8X64)]
    for t in texts:
        ids = tok.encode(t, max_length=64)
        if len(ids) != 64:
            raise SystemExit(f"bench: a text of TEXTS_8X64 gives {len(ids)} tokens, not 64: {t[:40]!r}")
        rows.append(ids)
    return {
        "mnist": {"pixels": pixels, "shape": [1, 1, 28, 28], "label": digits["labels"][0]},
        "minilm1": {"input_ids": [one], "attention_mask": [[1] * 8], "texts": [SENTENCE_1X8]},
        "minilm8": {"input_ids": rows, "attention_mask": [[1] * 64 for _ in rows], "texts": texts},
    }


def feeds(inputs: dict, name: str) -> dict:
    import numpy as np

    w = inputs[name]
    if name == "mnist":
        return {"pixels": np.asarray(w["pixels"], dtype=np.float32).reshape(w["shape"])}
    return {k: np.asarray(w[k], dtype=np.int64) for k in ("input_ids", "attention_mask")}


def ensure_minilm_f32() -> Path:
    """cache/minilm.f32.safetensors: the page's float16 weights widened on the host, so that the
    page downloads the same float32 bytes as onnxruntime-web's .onnx holds (and pure Python in
    Pyodide does not spend seconds widening 22 M values)."""
    from safetensors.numpy import save_file

    src = make_onnx.MINILM_WEIGHTS
    out, stamp = CACHE / "minilm.f32.safetensors", CACHE / "minilm.f32.safetensors.json"
    key = f"{src.stat().st_size}:{src.stat().st_mtime_ns}"
    if out.is_file() and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    save_file(make_onnx._load_f32(src), str(out))
    stamp.write_text(json.dumps({"key": key}) + "\n")
    return out


# ---- onnxruntime-web, the site, the server -------------------------------------------------

def ensure_ort() -> None:
    """onnxruntime-web at ORT_VERSION in tests/bench/web/node_modules (npm install when not); the
    bench cannot run without it."""
    try:
        npm_package(WEB, "onnxruntime-web", ORT_VERSION, log)
    except RuntimeError as e:
        raise SystemExit(f"bench web: {e}") from None


def site_dir(a) -> Path:
    given = given_site(a.site, "bench web")
    if given is not None:
        return given
    build = load_module(REPO / "build.py", "ember_build")
    build.ensure_pyodide()
    try:
        return Path(build.build_site())
    except (Exception, SystemExit) as e:   # a tree mid-edit by someone else: still bench the last site
        old = REPO / "site"
        if not (old / "manifest.json").is_file():
            raise
        log(f"WARNING: rebuilding the site failed ({type(e).__name__}: {e}); benchmarking the existing "
            f"site/ (its wheel is from {time.ctime((old / 'manifest.json').stat().st_mtime)})")
        return old


# ---- the browser run --------------------------------------------------------------------------

def run_page(browser, base: str, eng: tuple, model: str, plan: list, timeout_s: float,
             autotune: bool = False, *, context=None, snapshot: bool = False, tag: str = "") -> dict:
    """One bench page in a fresh context of ``browser`` (or a new page of ``context``, which
    stays open: a revisit)."""
    eid, engine, backend, threads, _ = eng
    q = urllib.parse.urlencode({"engine": engine, "backend": backend, "threads": threads,
                                "model": model, "autotune": int(autotune), "plan": json.dumps(plan),
                                "snapshot": int(snapshot)})
    crashed = None
    for attempt in range(2):
        ctx = context or browser.new_context()
        page, console = watched_page(ctx)
        t = time.monotonic()
        try:
            page.goto(f"{base}/bench/bench.html?{q}", timeout=timeout_s * 1000)
            res = wait_result(page, "benchResult", timeout_s)
        except Exception as e:   # a page that hangs or crashes is one failed column, not a failed bench
            res = {"status": "error", "reason": reason(e),
                   "workloads": {}, "phases": {}}
        finally:
            try:
                page.close()
                if context is None:
                    ctx.close()
            except Exception:       # (a crashed renderer's page and context may be gone already)
                pass
        # Chromium's renderer process died under the page ("Target crashed": once in a CI run of the
        # whole suite, 2.7 s into ember-python's MNIST page, never in a rerun): a first visit in a fresh
        # context runs once more, and the row says so
        if attempt or context is not None or "Target crashed" not in str(res.get("reason")):
            break
        crashed = res["reason"]
        log(f"{eid}/{model}: the browser's renderer crashed ({crashed}); running it once more")
    if crashed is not None:
        res["retried_after"] = crashed
    res["wall_s"] = time.monotonic() - t
    res["console"] = console[-30:]
    what = ", ".join(f"{k} {w['median_ms']:.2f} ms" for k, w in res.get("workloads", {}).items())
    if tag:
        what = f"first answer {res.get('cold_ms') or 0:.0f} ms since page open"
    log(f"{eid:<13} {model:<7}{tag} {res['status']:<5} {res['wall_s']:5.1f} s  "
        + (what if res["status"] == "ok" else res.get("reason") or ""))
    if res["status"] == "error":
        for line in console[-8:]:
            log(f"    {line[:300]}")
    return res


def run_start(pw, base: str, eng: tuple, timeout_s: float, visits: int = START_VISITS) -> list:
    """Page open -> first MNIST answer, ``visits`` times in one fresh browser profile (a
    persistent one on disk, as a user's: HTTP cache, Cache API and V8's code cache survive
    between visits). ember runs with its memory snapshots on (made after the first visit)."""
    plan = [{"name": "mnist", "warmup": 0, "reps": 0, "min_reps": 0, "budget_s": 0}]
    profile = tempfile.mkdtemp(prefix="ember-bench-profile-")
    out = []
    try:
        ctx = pw.chromium.launch_persistent_context(profile, executable_path=chromium(), headless=True,
                                                    args=chromium_args())
        try:
            for i in range(visits):
                out.append(run_page(None, base, eng, "mnist", plan, timeout_s, context=ctx,
                                    snapshot=eng[1] == "ember", tag=f" visit {i + 1}"))
        finally:
            ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    return out


# ---- the report -------------------------------------------------------------------------------

def max_abs_diff(a, b):
    if a is None or b is None or len(a) != len(b):
        return None
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def fmt_ms(v):
    if v is None:
        return "—"
    return f"{v:.3g}" if v < 100 else f"{v:,.0f}"


def fmt_sci(v):
    return "—" if v is None else ("0" if v == 0 else f"{v:.1e}")


def collect(results: dict, natives: dict) -> list:
    """One row per (workload, engine): dicts the table and the chart are made from."""
    rows = []
    for name, (model, label) in WORKLOADS.items():
        base = results.get((BASELINE, model), {}).get("workloads", {}).get(name)
        for eid, _, _, _, elabel in ENGINES:
            r = results.get((eid, model))
            if r is None:
                continue
            w = r.get("workloads", {}).get(name)
            row = {"workload": name, "wlabel": label, "engine": eid, "elabel": elabel, "status": r["status"],
                   "reason": r.get("reason"), "median_ms": None, "ratio": None, "runs": 0, "first_ms": None,
                   "cold_ms": None, "diff_ref": None, "diff_native": None, "phases": {}}
            if r["status"] == "ok" and w is None:
                row.update(status="skipped", reason="not run (about 270 s a run here; --python-minilm8 runs it)"
                           if eid == "ember-python" and name == "minilm8" else "not run")
            elif r["status"] == "ok":
                first = next(iter(r["workloads"])) == name
                row.update(median_ms=w["median_ms"], runs=len(w["runs_ms"]) * w.get("block", 1), first_ms=w["first_ms"],
                           cold_ms=r.get("cold_ms") if first else None, phases=r.get("phases", {}),
                           diff_ref=max_abs_diff(w["output"], base["output"]) if base else None,
                           diff_native=max_abs_diff(w["output"], natives.get(name)))
                if base and base["median_ms"]:
                    row["ratio"] = w["median_ms"] / base["median_ms"]
            rows.append(row)
    return rows


def table(rows: list, meta: dict) -> str:
    out = [f"# ember in the page vs onnxruntime-web ({meta['date']})", "",
           f"`{meta['command']}` — headless Chromium {meta['chromium']} (`--enable-unsafe-webgpu`: "
           f"SwiftShader, a CPU WebGPU adapter), {meta['machine']}; ember {meta['ember']} in Pyodide "
           f"{meta['pyodide']}; onnxruntime-web {ORT_VERSION}. Bench wall time {meta['wall_s']:.0f} s.", "",
           "| workload | engine | median ms | × ort wasm 1t | runs | first run ms | cold start ms "
           "| max abs diff vs ort wasm 1t | vs ember numpy (native) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["status"] != "ok":
            out.append(f"| {r['wlabel']} | {r['elabel']} | n/a | | | | | | {r['status']}: "
                       f"{(r['reason'] or '').replace('|', '/')} |")
            continue
        ratio = f"{r['ratio']:.2f}×" if r["ratio"] is not None else "—"
        out.append(f"| {r['wlabel']} | {r['elabel']} | {fmt_ms(r['median_ms'])} | {ratio} | {r['runs']} | "
                   f"{fmt_ms(r['first_ms'])} | {fmt_ms(r['cold_ms'])} | {fmt_sci(r['diff_ref'])} | "
                   f"{fmt_sci(r['diff_native'])} |")
    cold = [r for r in rows if r["cold_ms"] is not None]
    if cold:
        out += ["", "Cold start, ms since page open (fresh context): the engine ready (ember: Pyodide booted, "
                "wheel installed, WebGPU started where used), the model loaded (downloaded and built / "
                "session created), the first result.", "",
                "| model | engine | engine ready | model loaded | first result |", "|---|---|---:|---:|---:|"]
        for r in cold:
            out.append(f"| {r['wlabel'].split(',')[0]} | {r['elabel']} | {fmt_ms(r['phases'].get('engine_ready'))} | "
                       f"{fmt_ms(r['phases'].get('model_loaded'))} | {fmt_ms(r['cold_ms'])} |")
    out += ["", "Notes:",
            "- median ms: median of the timed runs after the warm-up (runs = how many; 0 means the "
            "first run is the figure). The warm-up is a few runs (MNIST 5, MiniLM 1×8 2, 8×64 1) and, "
            "for MNIST on every wasm engine (onnxruntime-web's and ember's alike), at least "
            f"{WARMUP_S['mnist']:g} s of runs: V8 tiers the page's code up over its first ~0.3-0.5 s "
            "of calls, and both engines' first ~15-20 MNIST runs after 5 warm-ups were still twice "
            "as slow as their later ones. MNIST on the wasm engines is timed in samples of "
            f"{BLOCK['mnist']} runs (each sample's mean per run; the median is over the samples): the "
            "page's clock ticks in 5 µs steps, 5% of a 0.1 ms run. One run = input tensors in, output "
            "read back into JS (ember on "
            "wasm/python: a plain Python call that reads the output synchronously; on webgpu an awaited "
            "readback; onnxruntime-web: `await session.run`).",
            "- × ort wasm 1t: this median over onnxruntime-web wasm 1-thread's median (> 1 is slower).",
            "- cold start: from navigation start to the first result of the page's first workload, in a fresh "
            "browser context (empty HTTP cache): page load, engine boot (ember: Pyodide boot, wheel install, "
            "backend init), model download and load (onnxruntime-web: session creation), first inference. "
            "MiniLM 8×64 runs in the 1×8 page after it, so it has no cold start of its own.",
            "- max abs diff: over the whole output (MNIST: 10 logits; MiniLM: 384-float unit embeddings); "
            "'vs ember numpy' is ember's numpy backend natively on the same inputs and weights.",
            f"- the pure-Python backend: {meta['python_note']}",
            f"- webgpu is SwiftShader here (a CPU adapter): MiniLM 8×64 takes about a minute a run there, so "
            f"those rows have one timed run after the first; ember webgpu runs with matmul autotune "
            f"{meta['autotune']}.",
            "- onnxruntime-web webgpu uses its `ort.webgpu.min.mjs` bundle with 1 wasm thread; "
            "the wasm columns `ort.wasm.min.mjs`; threads need the page's COOP/COEP isolation.",
            "- inputs: MNIST test digit 0 (a 7); MiniLM token ids from the demo's tokenizer "
            f"({SENTENCE_1X8!r}; eight texts cut to 64 tokens), attention mask all ones.",
            ""]
    return "\n".join(out)


def start_table(starts: dict) -> str:
    """The start-up rows: page open -> first MNIST answer, first visit then revisits."""
    if not starts:
        return ""
    label = {e[0]: e[4] for e in ENGINES}
    n = max(len(v) for v in starts.values())
    out = ["", "## Start: page open → first MNIST answer", "",
           "A fresh browser profile (on disk) per engine; visit 1 is a first visit, the next ones reopen "
           "the page in the same profile (HTTP cache, Cache API and V8's code cache kept; the server "
           "caches as ember.web does). ms since navigation start; engine ready / model loaded / first "
           "answer. ember runs with its memory snapshots on: a first visit restores the site's prebuilt "
           "snapshot where the site has one (and keeps a copy in the Cache API), else boots normally and "
           "makes one in the background after its answer (not counted); revisits restore the stored one.", "",
           "| engine | " + " | ".join("first visit" if i == 0 else f"revisit {i}" for i in range(n)) + " | ember booted from |",
           "|---|" + "---:|" * n + "---|"]
    for eid, visits in starts.items():
        cells, how = [], []
        for v in visits:
            if v["status"] != "ok":
                cells.append(f"{v['status']}: {(v.get('reason') or '')[:60].replace('|', '/')}")
                continue
            ph = v.get("phases", {})
            cells.append(f"{fmt_ms(ph.get('engine_ready'))} / {fmt_ms(ph.get('model_loaded'))} / "
                         f"**{fmt_ms(v.get('cold_ms'))}**")
            snap = ph.get("snapshot")
            if snap:
                snap = json.loads(snap)
                how.append(("site snapshot" if snap.get("source") == "site" else "snapshot")
                           if snap.get("used") else "normal boot")
        cells += [""] * (n - len(cells))
        out.append(f"| {label[eid]} | " + " | ".join(cells) + f" | {', '.join(how) or '—'} |")
    ember = [(eid, i, v) for eid, vs in starts.items() if eid.startswith("ember") for i, v in enumerate(vs)
             if v["status"] == "ok"]
    if ember:
        out += ["", "Where ember's start goes (ms, each step's own duration): the page and /wasm/ember.js "
                "loading; Pyodide ready (a normal boot, or the snapshot read, checked and restored); the "
                "wheels unpacked and `import ember` (with a snapshot: only unpacked and checked); "
                "`ember.wasm.init()` (the kernel module compiled); the bench's set-up (model.py, weights, "
                "model built, `ember.compile`); the first forward.", "",
                "| engine · visit | page + loader | Pyodide ready | wheel + import ember | wasm init "
                "| model loaded | first answer | total |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for eid, i, v in ember:
            ph = v.get("phases", {})
            marks = [ph.get(k) for k in ("loader_called", "pyodide_ready", "ember_imported", "wasm_ready",
                                         "model_loaded")] + [v.get("cold_ms")]
            if any(m is None for m in marks):
                continue
            steps = [marks[0]] + [b - a for a, b in zip(marks, marks[1:])]
            out.append(f"| {label[eid]} · {'first visit' if i == 0 else f'revisit {i}'} | "
                       + " | ".join(fmt_ms(x) for x in steps) + f" | {fmt_ms(marks[-1])} |")
    return "\n".join(out) + "\n"


def llm_section() -> str:
    """The LLM issue's in-page decode figures, from the last `bench llm` run with a browser (its
    raw results in .cache/bench_llm/), when there is one: this bench does not re-run it."""
    cache = REPO / ".cache" / "bench_llm"
    found = sorted((p for p in (cache / "results.json", cache / "results-browser.json") if p.is_file()),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        return ("\n## LLM decode in the page\n\nNot measured yet: `python3 build.py bench llm --browser-only` "
                "writes the figures this section shows (wllama and ember in the page, SmolLM2-135M).\n")
    try:
        data = json.loads(found[-1].read_text())
        rows = [r for r in data.get("rows", []) if r.get("place") == "browser"]
    except (OSError, ValueError, AttributeError) as e:
        return f"\n## LLM decode in the page\n\nCould not read {found[-1].name}: {e}\n"
    out = ["", "## LLM decode in the page", "",
           f"From `python3 build.py bench llm` ({found[-1].relative_to(REPO)}, "
           f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(found[-1].stat().st_mtime))}; not re-run here).", "",
           "| engine | config | file | decode tok/s | prompt tok/s | status |", "|---|---|---|---:|---:|---|"]
    for r in rows:
        out.append(f"| {r.get('engine')} | {r.get('config')} | {r.get('file')} | {fmt_ms(r.get('decode_tps'))} | "
                   f"{fmt_ms(r.get('prompt_tps'))} | {r.get('status')}"
                   + (f": {(r.get('reason') or '')[:80].replace('|', '/')}" if r.get("status") != "ok" else "") + " |")
    return "\n".join(out) + "\n"


def chart_svg(rows: list, meta: dict, starts: dict | None = None) -> str:
    """Horizontal bars, log scale: warm medians per workload, then cold starts, then start-up
    (first visit and revisits)."""
    colors = {"ort-wasm-1t": "#2563eb", "ort-wasm-2t": "#60a5fa", "ort-wasm-all": "#93c5fd", "ort-webgpu": "#1e3a8a",
              "ember-webgpu": "#c2410c", "ember-wasm": "#f97316", "ember-wasm-pool1": "#fb923c",
              "ember-wasm-poolall": "#fed7aa", "ember-python": "#fdba74"}
    panels = [(f"{WORKLOADS[n][1]}: median ms per run", [(r, r["median_ms"]) for r in rows if r["workload"] == n])
              for n in WORKLOADS]
    panels.append(("cold start ms (page open → first result)",
                   [(dict(r, elabel=f"{r['elabel']} · {r['wlabel'].split(',')[0]}"), r["cold_ms"])
                    for r in rows if r["cold_ms"] is not None or (r["status"] != "ok" and r["workload"] != "minilm8")]))
    if starts:
        label = {e[0]: e[4] for e in ENGINES}
        panels.append(("start ms, MNIST: page open → first answer (fresh profile, then revisits)",
                       [({"engine": eid, "elabel": f"{label[eid]} · {'first visit' if i == 0 else f'revisit {i}'}",
                          "status": v["status"], "reason": v.get("reason")}, v.get("cold_ms"))
                        for eid, visits in starts.items() for i, v in enumerate(visits)]))
    W, left, bar_h = 1000, 330, 18

    def bar(title, r, v, y, x):
        name = f'<text x="{left - 8}" y="{y + 13}" font-size="12" text-anchor="end">{r["elabel"]}</text>'
        if not v:
            return [name, f'<text x="{left + 5}" y="{y + 13}" font-size="12" fill="#888">n/a '
                          f'({html.escape((r.get("reason") or r["status"])[:80])})</text>']
        ratio = f'  ({r["ratio"]:.2f}×)' if r.get("ratio") is not None and "median" in title else ""
        return [name, f'<rect x="{left}" y="{y}" width="{max(1.0, x(v) - left):.1f}" height="{bar_h}" '
                      f'fill="{colors.get(r["engine"], "#888")}"/>',
                f'<text x="{x(v) + 5:.1f}" y="{y + 13}" font-size="12">{fmt_ms(v)}{ratio}</text>']

    parts = []
    parts.append(f'<text x="10" y="22" font-size="16" font-weight="600">ember in the page vs onnxruntime-web</text>')
    parts.append(f'<text x="10" y="40" font-size="12" fill="#444">headless Chromium {meta["chromium"]} '
                 f'(WebGPU: SwiftShader, a CPU adapter), {meta["machine"]}, {meta["date"]}</text>')
    parts.append('<text x="10" y="56" font-size="12" fill="#444">log scale, shorter is faster; '
                 '(×) = median over onnxruntime-web wasm 1 thread\'s</text>')
    drawn, y = log_panels(panels, width=W, left=left, right=150, bar_h=bar_h, gap=4, tick=fmt_ms, bar=bar)
    return svg_document(W, y + 10, parts + drawn)


# ---- main -------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: MNIST only, 1 timed run, ort wasm 1t vs ember wasm and python")
    ap.add_argument("--engines", help=f"comma list of {', '.join(e[0] for e in ENGINES)}")
    ap.add_argument("--workloads", help=f"comma list of {', '.join(WORKLOADS)}")
    ap.add_argument("--reps", type=int, help="at most this many timed runs per workload")
    ap.add_argument("--python-minilm8", action="store_true",
                    help="also run MiniLM 8x64 on the pure-Python backend (once, ~5 min)")
    ap.add_argument("--autotune", action="store_true",
                    help="ember webgpu: keep matmul autotuning on (the demo pages turn it off)")
    ap.add_argument("--site", help="a built ember site to serve (default: build.py site now)")
    ap.add_argument("--out", type=Path, help="folder for results.md/.png (default tests/bench/web, "
                                               "cache/quick with --quick)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per page")
    ap.add_argument("--no-start", action="store_true",
                    help="skip the start-up rows (first visit and revisits, MNIST)")
    ap.add_argument("--start-only", action="store_true", help="only the start-up rows")
    ap.add_argument("--start-visits", type=int, default=None,
                    help=f"visits per fresh profile in the start-up rows (default {START_VISITS}; "
                         "2 with --quick)")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    eids = (a.engines.split(",") if a.engines else QUICK_ENGINES if a.quick else [e[0] for e in ENGINES])
    wls = a.workloads.split(",") if a.workloads else (["mnist"] if a.quick else list(WORKLOADS))
    bad = [e for e in eids if e not in {x[0] for x in ENGINES}] + [w for w in wls if w not in WORKLOADS]
    if bad:
        raise SystemExit(f"bench web: unknown engine/workload {bad}")
    engines = [e for e in ENGINES if e[0] in eids]
    start_ids = [] if a.no_start else [e for e in (QUICK_START_ENGINES if a.quick else START_ENGINES)
                                       if not a.engines or e in eids]
    if a.start_only:
        engines, wls = [], ["mnist"]
    models = [m for m in ("mnist", "minilm") if any(WORKLOADS[w][0] == m for w in wls)]
    out_dir = a.out or (CACHE / "quick" if a.quick else WEB)

    ensure_ort()
    site = site_dir(a)
    CACHE.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs()
    (CACHE / "inputs.json").write_text(json.dumps(inputs))
    natives, checks = {}, {}
    for m in models:
        names = [w for w in wls if WORKLOADS[w][0] == m]
        _, checks[m] = make_onnx.ensure(m, [feeds(inputs, w) for w in names], log=log)
        for w in names:
            natives[w] = [float(v) for v in make_onnx.ember_reference(m, feeds(inputs, w)).ravel()]
    if "minilm" in models:
        ensure_minilm_f32()

    srv, base = serve({"/": site.resolve(), "/bench/": WEB.resolve(), "/cache/": CACHE.resolve(),
                       "/ort/": (ORT_DIR / "dist").resolve()}, caching=True)
    from playwright.sync_api import sync_playwright

    results = {}
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            for m in models:
                for eng in engines:
                    plan = plan_for(eng[0], [w for w in wls if WORKLOADS[w][0] == m], a)
                    results[(eng[0], m)] = run_page(browser, base, eng, m, plan, a.timeout, a.autotune)
            visits = a.start_visits or (2 if a.quick else START_VISITS)
            starts = {eid: run_start(pw, base, next(e for e in ENGINES if e[0] == eid), a.timeout, visits)
                      for eid in start_ids}
            manifest = json.loads((site / "manifest.json").read_text())
            meta = {"date": time.strftime("%Y-%m-%d"), "chromium": browser.version,
                    "machine": f"{platform.machine()}, {os.cpu_count()} cores"
                               + (f" (load average {load_start:.1f} at the start)" if load_start is not None else ""),
                    "ember": manifest.get("ember_version"), "pyodide": manifest.get("pyodide_version"),
                    "command": "python3 build.py bench web" + (" " + " ".join(argv if argv is not None else sys.argv[1:])
                                                               ).rstrip(),
                    "python_note": "as the others (--quick)." if a.quick else ("MNIST 10 runs; MiniLM 1×8: the cold run then 2 timed runs; MiniLM 8×64 "
                                    + ("once, no warm-up." if a.python_minilm8 else
                                       "not run (about 270 s a run here; `--python-minilm8` runs it once).")),
                    "autotune": "on (--autotune)" if a.autotune else
                                "off, as the demo pages run it (`--autotune` keeps it on)",
                    "wall_s": 0.0}
            rows = collect(results, natives)
            meta["wall_s"] = time.monotonic() - t_start
            md = (table(rows, meta) if rows else f"# ember in the page: start-up ({meta['date']})\n\n`{meta['command']}` "
                  f"— headless Chromium {meta['chromium']}, {meta['machine']}; ember {meta['ember']} in Pyodide "
                  f"{meta['pyodide']}; onnxruntime-web {ORT_VERSION}.\n") + start_table(starts) + llm_section()
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "results.md").write_text(md, encoding="utf-8")
            screenshot_svg(browser, chart_svg(rows, meta, starts), out_dir / "results.png")
        finally:
            browser.close()
            srv.shutdown()
    raw = {"meta": meta, "onnx_checks": checks,
           "results": {f"{e}/{m}": {k: v for k, v in r.items()} for (e, m), r in results.items()},
           "start": starts}
    (CACHE / ("quick-results.json" if a.quick else "results.json")).write_text(json.dumps(raw, indent=1))
    if a.json:
        a.json.write_text(json.dumps(raw, indent=1))
    print()
    print(md)
    log(f"wrote {out_dir / 'results.md'} and {out_dir / 'results.png'} in {time.monotonic() - t_start:.0f} s")
    failed = [f"{e}/{m}" for (e, m), r in results.items() if r["status"] == "error"]
    failed += [f"{e}/start visit {i + 1}" for e, vs in starts.items() for i, v in enumerate(vs) if v["status"] == "error"]
    if failed:
        log(f"errors in: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
