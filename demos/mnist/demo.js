// The MNIST page: drawing, MNIST-style preprocessing, loading, and the bridge to app.py, which
// runs in ember's Worker (Pyodide never runs on this thread, so drawing never stutters).
//
// JS API (for tests and for pages that embed the demo):
//   window.emberDemo.ready                     Promise, resolves (to .info) when the model answers
//                                              on the CPU; WebGPU starts after that
//   window.emberDemo.webgpuReady               Promise, resolves to {ok, error, ms} once WebGPU is
//                                              warm (the page then switches to it) or has failed
//   await window.emberDemo.predict(pixels, backend)
//        pixels: 784 numbers in [0, 1] (28x28 row major, white digit on black)
//        backend: "webgpu" | "cpu" | "python" (default: the one selected on the page); "cpu" is
//        ember's WebAssembly SIMD backend where it exists, "python" the pure-Python one
//        -> {digit, probs (10 numbers), ms (round trip from this thread), inferenceMs (in the
//            worker), backend, device (the ember device: "wasm" | "python" | "webgpu"),
//            unsure (null, or why the answer should not be trusted: a low top probability or
//            an input unlike a digit), top2 ([[digit, p], [digit, p]], the two likeliest)}
//   window.emberDemo.preprocess(canvas)        -> Float32Array(784) | null (empty drawing)
//   window.emberDemo.setBackend(name)          same as clicking the radio button
//   await window.emberDemo.idle()              resolves when no page prediction is pending
//   window.emberDemo.lastResult                the result shown on the page
//   window.emberDemo.info                      {webgpu, webgpuError, webgpuReadyMs, devices,
//                                              timings, steps, readyMs, ...}: webgpu is true once
//                                              the page runs the model there
//   window.emberDemo.worker                    the EmberWorker (see /wasm/ember.js)

import { loadEmber } from "../../wasm/ember.js";
import { SIDE, BRUSH, preprocess as preprocessDrawing, showInput as paintInput, clearPad, setupPad,
         imageCanvas, drawImage } from "./digitpad.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially } from "../../wasm/demo-kit.js";

const PY_DIR = "/home/pyodide/mnist";
// When to say "not sure" instead of naming a digit. The network is trained with label
// smoothing, so even clear test digits often stay below 95%; on the first 3000 MNIST test
// digits 3% are under 80% (and most of those are the ones it gets wrong), while a dot or a
// scribble comes out at 70-85%. The ink tests catch what the probabilities alone miss.
const SURE_ABOVE = 0.8;    // top probability
const MAX_DENSITY = 0.36;  // share of the 28x28 input at >= 50% ink: MNIST digits stay under 0.33
const MIN_INK_SIDE = 2 * BRUSH;  // ink bounding box on the pad (px): smaller is a dot, not a digit

const pad = $("pad");
const inputCtx = $("input28").getContext("2d");

let worker = null;         // the EmberWorker running app.py
let backends = null;       // the page's backend state (demo-kit's Backends)
let pending = null;              // the page's own latest prediction, if any
let dirty = false;
let lastInkSide = null;    // the ink's bounding box side on the pad, from the last preprocess()

// ---- drawing (the pad and the preprocessing live in digitpad.js, shared with demos/train/) ---

/** 28x28 Float32Array in [0, 1] from the drawing, or null if nothing is drawn. */
function preprocess(canvas) {
  const r = preprocessDrawing(canvas);
  lastInkSide = r ? r.inkSide : null;
  return r ? r.pixels : null;
}

function showInput(pixels) {
  paintInput(inputCtx, pixels);
}

function setupDrawing() {
  setupPad(pad, requestPredict);
  $("clear").addEventListener("click", () => {
    clearPad(pad);
    showInput(null);
    showResult(null);
  });
}

/** Draw a 28x28 uint8 MNIST image onto the pad (scaled up) and predict it. */
function drawSample(bytes) {
  drawImage(pad, bytes);
  requestPredict();
}

async function setupSamples() {
  const doc = await (await fetch("testdigits.json")).json();
  const box = $("samples");
  const seen = new Set();
  doc.images_hex.forEach((hex, i) => {
    const label = doc.labels[i];
    if (seen.has(label)) return;
    seen.add(label);
    const bytes = Uint8Array.from(hex.match(/../g), (h) => parseInt(h, 16));
    const btn = document.createElement("button");
    btn.type = "button";
    btn.title = `MNIST test image #${i} (a ${label})`;
    btn.dataset.label = label;
    btn.append(imageCanvas(bytes));
    btn.addEventListener("click", () => drawSample(bytes));
    box.append(btn);
  });
  [...box.children].sort((a, b) => a.dataset.label - b.dataset.label).forEach((b) => box.append(b));
}

// ---- results ----------------------------------------------------------------------------

function setupBars() {
  const ol = $("bars");
  for (let d = 0; d < 10; d++) {
    const li = document.createElement("li");
    li.innerHTML = `<span>${d}</span><div class="bar"><div class="fill"></div></div><span class="pct">–</span>`;
    ol.append(li);
  }
}

function showResult(r) {
  window.emberDemo.lastResult = r;
  const items = $("bars").children;
  for (let d = 0; d < 10; d++) {
    const p = r ? r.probs[d] : 0;
    items[d].querySelector(".fill").style.width = `${(p * 100).toFixed(1)}%`;
    items[d].querySelector(".pct").textContent = r ? `${(p * 100).toFixed(1)}%` : "–";
    items[d].classList.toggle("top", !!r && d === r.digit);
  }
  $("digit").textContent = r ? String(r.digit) : "?";
  $("digit").classList.toggle("empty", !r);
  $("digit").classList.toggle("unsure", !!(r && r.unsure));
  const pct = (p) => `${(p * 100).toFixed(0)}%`;
  if (r && r.unsure) {
    const [[a, pa], [b, pb]] = r.top2;
    $("confidence").textContent = `not sure: ${a} (${pct(pa)}) or ${b} (${pct(pb)})`;
    $("unsure-why").textContent = `${r.unsure[0].toUpperCase()}${r.unsure.slice(1)}: draw one digit, large, filling the pad.`;
  } else {
    $("confidence").textContent = r ? `${(r.probs[r.digit] * 100).toFixed(1)}% sure` : "";
    $("unsure-why").textContent = "";
  }
  $("unsure-why").hidden = !(r && r.unsure);
  $("ms").textContent = r ? `${r.ms.toFixed(1)} ms` : "–";
}

/** Why the prediction should not be trusted (null when it can be), and the two likeliest digits.
    ``inkSide``: the drawing's size on the pad when known (page drawings). */
function assess(probs, pixels, inkSide = null) {
  const order = probs.map((p, d) => [d, p]).sort((a, b) => b[1] - a[1]);
  const top2 = order.slice(0, 2);
  let dense = 0;
  for (const v of pixels) if (v >= 0.5) dense++;
  let unsure = null;
  if (inkSide !== null && inkSide < MIN_INK_SIDE) unsure = "the drawing is too small to be a digit";
  else if (dense / pixels.length > MAX_DENSITY) unsure = "the drawing has far more ink than a digit";
  else if (top2[0][1] < SURE_ABOVE) unsure = "the network is unsure";
  return { unsure, top2 };
}

function setBackend(name) {
  if (!backends) throw inputError("the model is not loaded yet: await emberDemo.ready");
  backends.select(name);   // calls back requestPredict
}

// ---- prediction -------------------------------------------------------------------------

/** Run one prediction through app.py in the worker; calls are queued (one at a time). */
function predict(pixels, which = backends ? backends.current : "cpu", inkSide = null) {
  if (!backends) return Promise.reject(inputError("the model is not loaded yet: await emberDemo.ready"));
  const bad = backends.check(which);
  if (bad) return Promise.reject(inputError(bad));
  if (!pixels || pixels.length !== SIDE * SIDE) {
    return Promise.reject(inputError(`predict: need 784 pixels (28x28), got ${pixels ? pixels.length : pixels}`));
  }
  const px = Float32Array.from(pixels);
  if (!px.every(Number.isFinite)) return Promise.reject(inputError("predict: pixels must be finite numbers"));
  return serially(async () => {
    const t0 = performance.now();
    const copy = Float32Array.from(px);   // px is handed over to the worker
    const r = await worker.call("app", "predict", [px, which], { transfer: [px.buffer] });
    const probs = Array.from(r.probs);
    return { digit: r.digit, probs, ms: performance.now() - t0,
             inferenceMs: r.inference_ms, backend: r.backend, device: r.device,
             ...assess(probs, copy, inkSide) };
  });
}

/** Predict what is on the pad; the latest drawing wins if several requests pile up. */
function requestPredict() {
  if (!backends) return;
  dirty = true;
  if (pending) return;
  pending = (async () => {
    while (dirty) {
      dirty = false;
      const pixels = preprocess(pad);
      showInput(pixels);
      if (!pixels) { showResult(null); continue; }
      try {
        showResult(await predict(pixels, backends.current, lastInkSide));
        clearError();
      } catch (e) {
        showError(e);
      }
    }
  })().finally(() => { pending = null; });   // runs after the assignment, even when no await
}

// ---- loading ----------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const bar = progressBar(0.85, 0.1);
  setupBars();
  setupDrawing();
  const samples = setupSamples();
  const weightsUrl = new URL("mnist.safetensors", location.href).href;
  const pyFiles = ["model.py", "app.py"];

  // The worker downloads the weights and the Python files (from the browser's cache after the
  // first visit) while Pyodide starts; nothing heavy ever runs on this thread.
  worker = await loadEmber({
    worker: true, onProgress: bar.boot, prefetch: [weightsUrl, ...pyFiles],
    onDownload: (p) => { if (p.url === weightsUrl) bar.weights(p.fraction, p.cached ? "weights (cached)"
      : `weights ${(p.loaded / 1024).toFixed(0)} / ${(p.total / 1024).toFixed(0)} KB`); },
  });
  const info = { ...worker.info, webgpu: false, webgpuError: null };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;
  const steps = { emberReady: performance.now() - t0 };

  bar(0.02, "Loading the model");
  const [devices, weights] = await Promise.all([
    startApp(worker, PY_DIR, pyFiles),
    worker.fetchFile(weightsUrl, `${PY_DIR}/mnist.safetensors`),
  ]);
  const loaded = await worker.call("app", "load", [`${PY_DIR}/mnist.safetensors`]);
  const meta = loaded.metadata || {};
  info.devices = loaded.devices;
  info.weightsCached = weights.cached;
  steps.modelLoaded = performance.now() - t0;

  backends = new Backends({ devices, info, demo: "MNIST", onChange: () => requestPredict() });
  await samples;
  bar(0.05, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  info.steps = steps;   // ms since this script started: ember booted, model loaded
  const kb = (weights.bytes / 1024).toFixed(0);
  $("model-info").textContent = meta.test_accuracy
    ? `Weights: ${kb} KB, trained with ${meta.trainer || "?"} (${meta.epochs || "?"} epochs, ` +
      `${meta.date || ""}); MNIST test accuracy ${(100 * Number(meta.test_accuracy)).toFixed(2)}%. ` +
      `Ready in ${(info.readyMs / 1000).toFixed(1)} s.`
    : `Weights: ${kb} KB. Ready in ${(info.readyMs / 1000).toFixed(1)} s.`;

  // Now WebGPU, in the background: the page already answers on the CPU meanwhile.
  backends.startWebGPU(worker, () => worker.call("app", "start_webgpu"), t0).then(webgpuDone);
  return info;
}

let webgpuDone;
window.emberDemo = {
  predict,
  preprocess,
  setBackend,
  idle: async () => { while (pending) await pending; },
  lastResult: null,
  info: null,
  worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
};
window.emberDemo.ready = main().catch((e) => {
  webgpuDone({ ok: false, error: `the page did not load: ${e.message || e}`, ms: 0 });
  return loadFailed(e);
});
