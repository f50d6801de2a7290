// One engine on one model, timed in the page; driven by tests/bench/bench_web.py.
//
// Query string: engine=ember|ort, backend=(ember) webgpu|wasm|python, (ort) wasm|webgpu,
// threads=N (ort: wasm threads; ember: its wasm thread pool, ember.wasm.set_threads; -1 =
// navigator.hardwareConcurrency; 0 = the engine's default), model=mnist|minilm,
// autotune=1 (ember webgpu: keep matmul autotuning on), snapshot=1 (ember: loadEmber's memory
// snapshots on, and the result waits for the background snapshot to be stored; the timed
// columns run with snapshots off so that no background work competes with them),
// plan=JSON list of {name, warmup, warmup_s, reps, min_reps, budget_s, block}
// (workloads: mnist, minilm1, minilm8; the first one's first result is the cold start).
//
// window.benchResult = {status: "ok" | "n/a" | "error", reason, phases, cold_ms, workloads:
// {name: {first_ms, runs_ms, median_ms, output}}}. phases: engine_ready and model_loaded (and
// for ember pyodide_ready, ember_imported, webgpu_ready) in ms since page open; ember's
// *_ms entries are durations of its set-up steps in Python.
// Every time is performance.now(): ms since navigation start (5 µs resolution here, the page
// is cross-origin isolated).

const params = new URLSearchParams(location.search);
const cfg = {
  engine: params.get("engine"),
  backend: params.get("backend"),
  threads: Number(params.get("threads") || 0),
  snapshot: params.get("snapshot") === "1",
  model: params.get("model"),
  autotune: params.get("autotune") === "1",
  plan: JSON.parse(params.get("plan") || "[]"),
};
const logEl = document.getElementById("log");
const log = (msg) => {
  logEl.textContent += `\n${performance.now().toFixed(0)} ms  ${msg}`;
};

/** A workload's input arrays, from inputs.json (written by bench_web.py for both engines). */
function inputsOf(all, name) {
  const w = all[name];
  if (!w) throw new Error(`inputs.json has no workload ${name}`);
  return w;
}

// ---- engines: each has init(inputs promise) -> phases, run(name) -> Float32Array -------------

class Unavailable extends Error {}

async function emberEngine() {   // (its Python reads /cache/inputs.json itself)
  const phases = {};
  const mod = await import("/wasm/ember.js");
  const t0 = performance.now();   // loadEmber's timings count from its call: shift them to page open
  const py = await mod.loadEmber({ webgpu: cfg.backend === "webgpu", snapshot: cfg.snapshot ? "auto" : false });
  phases.engine_ready = performance.now();
  const tm = py.ember.timings;
  Object.assign(phases, { pyodide_ready: t0 + tm.pyodideReady, ember_imported: t0 + tm.emberImported });
  if (tm.webgpuReady !== undefined) phases.webgpu_ready = t0 + tm.webgpuReady;
  if (tm.wasmReady !== undefined) phases.wasm_ready = t0 + tm.wasmReady;
  phases.loader_called = t0;
  phases.ember_timings = JSON.stringify(tm);   // every step of the loader (ember.js: timings)
  const src = await (await fetch("ember_bench.py", { cache: "no-cache" })).text();
  py.FS.mkdirTree("/bench");
  py.FS.writeFile("/bench/ember_bench.py", src);
  py.runPython("import sys\nif '/bench' not in sys.path: sys.path.insert(0, '/bench')\nimport ember_bench");
  phases.snapshot = py.ember.snapshot ? JSON.stringify(py.ember.snapshot) : null;
  const threads = cfg.threads < 0 ? navigator.hardwareConcurrency : cfg.threads;
  py.globals.set("bench_cfg", py.toPy({ model: cfg.model, device: cfg.backend, autotune: cfg.autotune, threads }));
  try {
    const info = await py.runPythonAsync("await ember_bench.setup(**bench_cfg)");
    Object.assign(phases, info.toJs({ dict_converter: Object.fromEntries }));
    info.destroy();
  } catch (e) {
    const msg = String(e && e.message ? e.message : e);
    const m = msg.match(/BenchUnavailable: (.*)/);
    if (m) throw new Unavailable(m[1].trim());
    throw e;
  }
  phases.model_loaded = performance.now();
  // Call the Python function directly, as a page calls its model (onnxruntime: session.run):
  // runPythonAsync would parse and compile a code string on every run (~5 ms here). It returns
  // the output (CPU backends: read synchronously) or, on webgpu, a coroutine that is awaited.
  const pyRun = py.runPython("ember_bench.run");
  return {
    phases,
    snapshotSaved: cfg.snapshot && mod.snapshotSaved ? () => mod.snapshotSaved() : null,
    async run(name) {
      const out = await pyRun(name);
      const flat = Float32Array.from(out.toJs());
      out.destroy();
      return flat;
    },
  };
}

async function ortEngine(inputsP) {
  const phases = {};
  const bundle = cfg.backend === "webgpu" ? "ort.webgpu.min.mjs" : "ort.wasm.min.mjs";
  const ort = await import(`/ort/${bundle}`);
  ort.env.wasm.wasmPaths = "/ort/";
  const threads = cfg.threads < 0 ? navigator.hardwareConcurrency : cfg.threads || 1;
  ort.env.wasm.numThreads = threads;
  phases.threads = threads;
  if (threads > 1 && !self.crossOriginIsolated) {
    throw new Unavailable("threads need a cross-origin isolated page (COOP/COEP), and this one is not");
  }
  if (cfg.backend === "webgpu" && !navigator.gpu) throw new Unavailable("navigator.gpu is missing");
  phases.engine_ready = performance.now();
  const session = await ort.InferenceSession.create(`/cache/${cfg.model}.onnx`, {
    executionProviders: [cfg.backend],
    graphOptimizationLevel: "all",
  });
  phases.model_loaded = performance.now();
  const inputs = await inputsP;
  const feeds = {};
  for (const step of cfg.plan) {
    const w = inputsOf(inputs, step.name);
    if (cfg.model === "mnist") {
      feeds[step.name] = () => ({ pixels: new ort.Tensor("float32", Float32Array.from(w.pixels), w.shape) });
    } else {
      const [b, l] = [w.input_ids.length, w.input_ids[0].length];
      const ids = BigInt64Array.from(w.input_ids.flat(), BigInt);
      const mask = BigInt64Array.from(w.attention_mask.flat(), BigInt);
      feeds[step.name] = () => ({ input_ids: new ort.Tensor("int64", ids, [b, l]),
                                  attention_mask: new ort.Tensor("int64", mask, [b, l]) });
    }
  }
  return {
    phases,
    async run(name) {
      const res = await session.run(feeds[name]());
      const t = res[session.outputNames[0]];
      const data = await t.getData();   // on the CPU already for the default output location
      return Float32Array.from(data);
    },
  };
}

// ---- timing ------------------------------------------------------------------------------

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const n = s.length;
  return n ? (n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2) : null;
}

async function timeWorkload(engine, step, result, first) {
  const t0 = performance.now();
  let out = await engine.run(step.name);
  const t1 = performance.now();
  if (first) result.cold_ms = t1;
  const w = { first_ms: t1 - t0, runs_ms: [] };
  result.workloads[step.name] = w;
  log(`${step.name}: first run ${(t1 - t0).toFixed(1)} ms`);
  // Warm-up: step.warmup runs, and runs until step.warmup_s seconds have passed (the same for
  // every engine: V8 tiers the page's code up over its first fraction of a second of calls).
  const w0 = performance.now();
  let warm = 0;
  while (warm < (step.warmup || 0) || performance.now() - w0 < 1000 * (step.warmup_s || 0)) {
    out = await engine.run(step.name);
    warm++;
  }
  w.warmup_runs = warm;
  w.warmup_ms = performance.now() - w0;
  // Timed samples of step.block runs each (1: every run timed alone), recorded as the mean run
  // of the sample: the page's clock ticks in 5 us steps, coarse for a 0.1 ms run.
  const block = Math.max(1, step.block || 1);
  w.block = block;
  const start = performance.now();
  const minReps = Math.min(step.reps, step.min_reps ?? 3);
  while (w.runs_ms.length * block < step.reps &&
         (w.runs_ms.length * block < minReps || performance.now() - start < 1000 * (step.budget_s || 1e9))) {
    const a = performance.now();
    for (let j = 0; j < block; j++) out = await engine.run(step.name);
    w.runs_ms.push((performance.now() - a) / block);
  }
  // No timed run asked for (a workload too slow to repeat): the first run is the figure.
  w.median_ms = w.runs_ms.length ? median(w.runs_ms) : w.first_ms;
  w.output = Array.from(out);
  log(`${step.name}: median ${w.median_ms.toFixed(2)} ms over ${w.runs_ms.length} runs`);
}

async function main() {
  const result = { ...cfg, status: "ok", reason: null, phases: {}, cold_ms: null, workloads: {},
                   isolated: self.crossOriginIsolated, userAgent: navigator.userAgent };
  try {
    // The inputs download alongside the engine's start (neither waits for the other to begin).
    const inputsP = fetch("/cache/inputs.json", { cache: "no-cache" }).then((r) => r.json()).then((x) => {
      result.phases.inputs_fetched = performance.now();
      return x;
    });
    inputsP.catch(() => {});
    const engine = cfg.engine === "ember" ? await emberEngine() : await ortEngine(inputsP);
    await inputsP;
    Object.assign(result.phases, engine.phases);
    log(`${cfg.engine} ${cfg.backend} ready`);
    let first = true;
    for (const step of cfg.plan) {
      await timeWorkload(engine, step, result, first);
      first = false;
    }
    // A first visit's snapshot is made in the background after the first answer: wait for it
    // here (outside every timed window) so that the next visit can use it.
    if (engine.snapshotSaved) result.snapshot_saved = await engine.snapshotSaved();
  } catch (e) {
    result.status = e instanceof Unavailable ? "n/a" : "error";
    result.reason = String(e && e.message ? e.message : e).split("\n").slice(-3).join(" ").slice(0, 400);
    log(`${result.status}: ${result.reason}`);
  }
  window.benchResult = result;
}

main();
