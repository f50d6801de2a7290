// The training page: loading, the training loop's driver, live charts, pause/resume, the
// drawing pad (shared with the MNIST demo: ../mnist/digitpad.js) and the weights download.
// app.py does the work in ember's Worker; this thread only draws, so the page never freezes.
//
// The loop is driven from here in chunks: each worker call runs a few optimizer steps (sized
// to take ~250 ms), then the charts are redrawn and a pause takes effect.
//
// JS API (for tests and for pages that embed the demo):
//   window.emberDemo.ready           Promise, resolves (to .info) when the data is loaded and
//                                    the page can train on the CPU; WebGPU starts after that
//   window.emberDemo.webgpuReady     Promise, resolves to {ok, error, ms} once WebGPU's
//                                    training kernels are compiled, or it failed
//   await window.emberDemo.train({steps = 600, backend = the selected one, batch = 32, seed = 0,
//                                 lr = 0.003, evalEvery = steps / 10 (at least 20)})
//        trains a fresh network (Adam, one-cycle learning rate peaking at lr over the steps; the
//        same seed gives the same run on every backend) -> {steps, loss_first (the first step's loss), loss_last (mean
//        of the last 20 steps), accuracy (on the 1,000 held-back digits), ms_per_step (worker
//        time per optimizer step, without evaluations and pauses), backend, device, batch,
//        history: {loss: [...], heldOut: [[step, accuracy], ...]}}
//        backend: "webgpu" | "cpu" (WebAssembly SIMD where it exists) | "python" (pure Python)
//   window.emberDemo.pause() / resume()    -> {step, paused}; a paused train() stays pending
//   window.emberDemo.status()              -> {training, paused, step, steps, backend}
//   await window.emberDemo.predict(pixels) -> {digit, probs} of the current network for 784
//        numbers in [0, 1] (28x28 row major, white digit on black)
//   await window.emberDemo.weights()       -> Uint8Array: the network as safetensors
//   window.emberDemo.info, window.emberDemo.worker

import { loadEmber } from "../../wasm/ember.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially } from "../../wasm/demo-kit.js";
import { SIDE, preprocess, showInput, clearPad, setupPad, imageCanvas, drawImage } from "../mnist/digitpad.js";

const PY_DIR = "/home/pyodide/train";
const DATA_FILES = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                    "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"];
const CHUNK_MS = 250;        // target time of one worker call (steps between redraws / pauses)
const LAST_N = 20;           // loss_last: the mean of this many last steps

const pad = $("pad");
const inputCtx = $("input28").getContext("2d");

let worker = null;
let backends = null;
let run = null;              // the training run in progress (or the last one)
let lastResult = null;

// ---- charts ---------------------------------------------------------------------------------

/** Line chart on a canvas: `series` = [{points: [[x, y], ...], color, width, dots}], axes from
 *  0..xmax and ymin..ymax, horizontal grid lines at `grid` values. */
function chart(canvas, series, { xmax, ymin, ymax, grid, fmt }) {
  const c = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height;
  const L = 44, R = 8, T = 8, B = 20;
  c.clearRect(0, 0, W, H);
  c.font = "11px system-ui, sans-serif";
  c.fillStyle = "#5b6470";
  c.strokeStyle = "#e3e6ea";
  c.lineWidth = 1;
  const X = (x) => L + (W - L - R) * (xmax > 0 ? x / xmax : 0);
  const Y = (y) => T + (H - T - B) * (1 - (Math.min(ymax, Math.max(ymin, y)) - ymin) / (ymax - ymin));
  for (const g of grid) {
    c.beginPath(); c.moveTo(L, Y(g)); c.lineTo(W - R, Y(g)); c.stroke();
    c.textAlign = "right"; c.fillText(fmt(g), L - 4, Y(g) + 4);
  }
  c.textAlign = "left";
  c.fillText("step 0", L, H - 5);
  c.textAlign = "right";
  c.fillText(String(xmax), W - R, H - 5);
  for (const s of series) {
    const pts = s.points;
    if (!pts.length) continue;
    c.strokeStyle = s.color;
    c.fillStyle = s.color;
    c.lineWidth = s.width || 1.5;
    // At most ~2 points per pixel column: long runs stay cheap to redraw.
    const every = Math.max(1, Math.floor(pts.length / (2 * (W - L - R))));
    c.beginPath();
    pts.forEach(([x, y], i) => {
      if (i % every && i !== pts.length - 1) return;
      if (i === 0) c.moveTo(X(x), Y(y)); else c.lineTo(X(x), Y(y));
    });
    c.stroke();
    if (s.dots) for (const [x, y] of pts) { c.beginPath(); c.arc(X(x), Y(y), 2.5, 0, 2 * Math.PI); c.fill(); }
  }
}

function smooth(values, alpha = 0.05) {
  const out = [];
  let m = null;
  values.forEach((v, i) => { m = m === null ? v : m + alpha * (v - m); out.push([i + 1, m]); });
  return out;
}

function drawCharts() {
  const r = run;
  const xmax = r ? Math.max(r.steps, 1) : 1;
  const loss = r ? r.losses : [];
  const top = Math.max(2.5, ...loss.slice(0, 5));
  chart($("loss-chart"), [
    { points: loss.map((v, i) => [i + 1, v]), color: "#cbd5e1", width: 1 },
    { points: smooth(loss), color: "#ea580c", width: 2 },
  ], { xmax, ymin: 0, ymax: top, grid: [0, 0.5, 1, 1.5, 2, 2.5].filter((g) => g <= top), fmt: (g) => g.toFixed(1) });
  chart($("acc-chart"), [
    { points: r ? smooth(r.correct) : [], color: "#94a3b8", width: 1.5 },
    { points: r ? r.heldOut : [], color: "#2563eb", width: 2, dots: true },
  ], { xmax, ymin: 0, ymax: 1, grid: [0, 0.25, 0.5, 0.75, 0.9, 1], fmt: (g) => `${Math.round(g * 100)}%` });
}

function showStats() {
  const r = run;
  $("step").textContent = r ? `${r.done} / ${r.steps}` : "0";
  $("rate").textContent = r && r.trainMs > 0 ? (1000 * r.done / r.trainMs).toFixed(1) : "–";
  const last = r && r.losses.length ? r.losses.slice(-LAST_N) : null;
  $("loss").textContent = last ? (last.reduce((a, b) => a + b, 0) / last.length).toFixed(3) : "–";
  const acc = r && r.heldOut.length ? r.heldOut[r.heldOut.length - 1][1] : null;
  $("acc").textContent = acc === null ? "–" : `${(100 * acc).toFixed(1)}%`;
  $("state").textContent = !r ? "not trained yet" : r.failed ? "failed" : r.paused ? "paused"
    : r.active ? "training…" : `trained (${r.done} steps)`;
  $("pause").disabled = !(r && r.active);
  $("pause").textContent = r && r.paused ? "Resume" : "Pause";
  $("train").textContent = r && r.active ? "Restart" : "Train";
  if (r) $("backend-name").textContent = backends.label(r.backend) + (r.backend !== backends.current
    ? ` (${backends.label(backends.current)} from the next run)` : "");
}

// ---- training -------------------------------------------------------------------------------

function positiveInt(v, what, max) {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > max) throw inputError(`${what} must be a whole number from 1 to ${max}, got ${v}`);
  return n;
}

async function evaluateHeldOut(r) {
  const e = await serially(() => worker.call("app", "evaluate", []));
  r.heldOut.push([r.done, e.accuracy]);
  r.evalMs += e.ms;
  return e.accuracy;
}

/** Train a fresh network; resolves when `steps` steps are done (pauses included). */
async function train({ steps = 600, backend = null, batch = 32, seed = 0, lr = 0.003, evalEvery = null } = {}) {
  if (!backends) throw inputError("the page is not loaded yet: await emberDemo.ready");
  steps = positiveInt(steps, "steps", 100000);
  batch = positiveInt(batch, "batch", 1024);
  // Ten points on the held-back accuracy curve by default (each is a pass over 1,000 digits).
  evalEvery = positiveInt(evalEvery ?? Math.max(20, Math.round(steps / 10)), "evalEvery", 100000);
  lr = Number(lr);
  if (!(lr > 0 && lr < 1)) throw inputError(`lr must be a number between 0 and 1, got ${lr}`);
  backend = backend || backends.current;
  const bad = backends.check(backend);
  if (bad) throw inputError(bad);
  if (run && run.active) run.cancel = true;      // a new run replaces the one in progress
  const r = run = { active: true, paused: false, cancel: false, steps, batch, backend, done: 0, losses: [],
                    correct: [], heldOut: [], trainMs: 0, evalMs: 0, wake: null, failed: false };
  drawCharts();
  showStats();
  try {
    const info = await serially(() => worker.call("app", "reset", [backend, batch, seed, lr, steps]));
    r.device = info.device;
    let chunk = 2;
    let nextEval = evalEvery;
    while (r.done < steps) {
      if (r.cancel) throw Object.assign(new Error("replaced by a new training run"), { name: "AbortError" });
      if (r.paused) {
        showStats();
        await new Promise((wake) => { r.wake = wake; });
        continue;
      }
      const n = Math.min(chunk, steps - r.done, nextEval - r.done);
      const out = await serially(() => worker.call("app", "steps", [n]));
      if (r.cancel) continue;
      r.losses.push(...out.losses);
      r.correct.push(...out.correct);
      r.done += n;
      r.trainMs += out.ms;
      // Next chunk sized to take about CHUNK_MS at the speed just measured.
      chunk = Math.max(1, Math.min(200, Math.round(CHUNK_MS * n / Math.max(out.ms, 1))));
      if (r.done >= nextEval && r.done < steps) {
        await evaluateHeldOut(r);
        nextEval += evalEvery;
      }
      drawCharts();
      showStats();
    }
    const accuracy = await evaluateHeldOut(r);
    r.active = false;
    drawCharts();
    showStats();
    clearError();
    const last = r.losses.slice(-LAST_N);
    return { steps: r.done, loss_first: r.losses[0], loss_last: last.reduce((a, b) => a + b, 0) / last.length,
             accuracy, ms_per_step: r.trainMs / r.done, backend, device: r.device, batch,
             history: { loss: r.losses, heldOut: r.heldOut } };
  } catch (e) {
    if (run === r) { r.active = false; r.failed = !r.cancel; showStats(); }
    throw e;
  }
}

function pause() {
  if (run && run.active) run.paused = true;
  showStats();
  return { step: run ? run.done : 0, paused: !!(run && run.paused) };
}

function resume() {
  if (run && run.paused) {
    run.paused = false;
    if (run.wake) { const w = run.wake; run.wake = null; w(); }
  }
  showStats();
  return { step: run ? run.done : 0, paused: false };
}

function status() {
  return run ? { training: run.active, paused: run.paused, step: run.done, steps: run.steps, backend: run.backend }
    : { training: false, paused: false, step: 0, steps: 0, backend: null };
}

// ---- the model in use ---------------------------------------------------------------------------

function predict(pixels) {
  if (!worker) return Promise.reject(inputError("the page is not loaded yet: await emberDemo.ready"));
  if (!pixels || pixels.length !== SIDE * SIDE) {
    return Promise.reject(inputError(`predict: need 784 pixels (28x28), got ${pixels ? pixels.length : pixels}`));
  }
  const px = Float32Array.from(pixels);
  if (!px.every(Number.isFinite)) return Promise.reject(inputError("predict: pixels must be finite numbers"));
  return serially(async () => {
    const r = await worker.call("app", "predict", [px], { transfer: [px.buffer] });
    return { digit: r.digit, probs: Array.from(r.probs) };
  });
}

async function weights() {
  if (!worker) throw inputError("the page is not loaded yet: await emberDemo.ready");
  const raw = await serially(() => worker.call("app", "weights", []));
  return raw instanceof Uint8Array ? raw : new Uint8Array(raw);
}

function showPrediction(r) {
  lastResult = r;
  window.emberDemo.lastResult = r;
  $("digit").textContent = r ? String(r.digit) : "?";
  $("digit").classList.toggle("empty", !r);
  $("confidence").textContent = r ? `${(100 * r.probs[r.digit]).toFixed(0)}%` +
    (run && run.done ? "" : " (untrained network)") : "";
}

let drawing = null, redraw = false;

/** Predict what is on the pad; the latest drawing wins when strokes pile up. */
function predictPad() {
  redraw = true;
  if (drawing) return drawing;
  drawing = (async () => {
    while (redraw) {
      redraw = false;
      const got = preprocess(pad);
      showInput(inputCtx, got ? got.pixels : null);
      if (!got) { showPrediction(null); continue; }
      try {
        showPrediction(await predict(got.pixels));
      } catch (e) {
        showError(e);
      }
    }
  })().finally(() => { drawing = null; });
  return drawing;
}

function setupPage() {
  setupPad(pad, predictPad);
  showInput(inputCtx, null);
  $("clear").addEventListener("click", () => { clearPad(pad); showInput(inputCtx, null); showPrediction(null); });
  const report = (p) => p.catch((e) => { if (e.name !== "AbortError") showError(e); });
  $("train").addEventListener("click", () => {
    clearError();
    try {
      report(train({ steps: $("steps").value, batch: Number($("batch").value) }).then(() => {
        if (preprocess(pad)) predictPad();      // re-read the drawing with the trained network
      }));
    } catch (e) { showError(e); }
  });
  $("pause").addEventListener("click", () => (run && run.paused ? resume() : pause()));
  $("download").addEventListener("click", () => report((async () => {
    const raw = await weights();
    const a = document.createElement("a");
    a.href = URL.createObjectURL(new Blob([raw], { type: "application/octet-stream" }));
    a.download = `ember-mnist-trainnet-${run ? run.done : 0}steps.safetensors`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  })()));
  drawCharts();
}

async function setupSamples() {
  const list = await worker.call("app", "samples", []);
  const box = $("samples");
  for (const s of list) {
    const bytes = s.pixels instanceof Uint8Array ? s.pixels : new Uint8Array(s.pixels);
    const btn = document.createElement("button");
    btn.type = "button";
    btn.title = `held-back MNIST test image #${s.index} (a ${s.label})`;
    btn.dataset.label = s.label;
    btn.append(imageCanvas(bytes));
    btn.addEventListener("click", () => { drawImage(pad, bytes); predictPad(); });
    box.append(btn);
  }
}

// ---- loading --------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const bar = progressBar(0.85, 0.1);
  setupPage();
  const dataUrls = DATA_FILES.map((f) => new URL(`data/${f}`, location.href).href);
  const pyFiles = ["app.py", "../mnist/mnist_idx.py"];
  const got = new Map();
  worker = await loadEmber({
    worker: true, onProgress: bar.boot, prefetch: [...dataUrls, ...pyFiles],
    onDownload: (p) => {
      if (!dataUrls.includes(p.url)) return;
      got.set(p.url, p.fraction || 0);
      const f = [...got.values()].reduce((a, b) => a + b, 0) / dataUrls.length;
      bar.weights(f, p.cached ? "MNIST subset (cached)" : "MNIST subset (1.1 MB)");
    },
  });
  const info = { ...worker.info, webgpu: false, webgpuError: null };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;
  bar(0.02, "Loading the digits");
  const [devices] = await Promise.all([
    startApp(worker, PY_DIR, pyFiles),
    ...dataUrls.map((u, i) => worker.fetchFile(u, `${PY_DIR}/data/${DATA_FILES[i]}`)),
  ]);
  const setup = await worker.call("app", "setup", [`${PY_DIR}/data`]);
  info.devices = setup.devices;
  info.data = { train: setup.train, test: setup.test };
  backends = new Backends({ devices, info, demo: "training", onChange: () => showStats() });
  // Stay on the CPU when WebGPU comes up: switching under a running training would be confusing
  // (and a software adapter is slower than the CPU); the notice says it can be picked.
  backends.picked = true;
  await setupSamples();
  bar(0.05, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  showStats();
  $("backend-name").textContent = backends.label(backends.current);
  // The warm-up runs a training step on the GPU: queued with the page's other calls, since a
  // synchronous GPU readback inside it (JSPI) would let another call run in the middle of its
  // backward pass, while ember's autodiff has recording suspended.
  backends.startWebGPU(worker, () => serially(() => worker.call("app", "start_webgpu")), t0).then(webgpuDone);
  return info;
}

let webgpuDone;
window.emberDemo = {
  train, pause, resume, status, predict, weights,
  idle: async () => { while (drawing) await drawing; },
  lastResult, info: null, worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
};
window.emberDemo.ready = main().catch((e) => {
  webgpuDone({ ok: false, error: `the page did not load: ${e.message || e}`, ms: 0 });
  return loadFailed(e);
});
