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
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially } from "../../wasm/demo-kit.js";

const SIDE = 28;
const BOX = 20;            // MNIST: the ink's bounding box is scaled to fit 20x20...
const CENTRE = 14;         // ...then shifted so its centre of mass sits at pixel (14, 14)
const BRUSH = 20;          // stroke width on the 280 px pad: ~2 px after scaling, like MNIST
const PY_DIR = "/home/pyodide/mnist";
// When to say "not sure" instead of naming a digit. The network is trained with label
// smoothing, so even clear test digits often stay below 95%; on the first 3000 MNIST test
// digits 3% are under 80% (and most of those are the ones it gets wrong), while a dot or a
// scribble comes out at 70-85%. The ink tests catch what the probabilities alone miss.
const SURE_ABOVE = 0.8;    // top probability
const MAX_DENSITY = 0.36;  // share of the 28x28 input at >= 50% ink: MNIST digits stay under 0.33
const MIN_INK_SIDE = 2 * BRUSH;  // ink bounding box on the pad (px): smaller is a dot, not a digit

const pad = $("pad");
const padCtx = pad.getContext("2d", { willReadFrequently: true });
const inputCtx = $("input28").getContext("2d");

let worker = null;         // the EmberWorker running app.py
let backends = null;       // the page's backend state (demo-kit's Backends)
let pending = null;              // the page's own latest prediction, if any
let dirty = false;
let lastInkSide = null;    // the ink's bounding box side on the pad, from the last preprocess()

// ---- preprocessing (what MNIST did to each scanned digit) ---------------------------------

/** Area-average resampling of a 1-D signal of length n to length m (m <= n or not). */
function resampleWeights(n, m) {
  const out = [];
  const step = n / m;
  for (let j = 0; j < m; j++) {
    const a = j * step, b = (j + 1) * step;
    const taps = [];
    for (let k = Math.floor(a); k < Math.min(n, Math.ceil(b)); k++) {
      const w = Math.min(b, k + 1) - Math.max(a, k);
      if (w > 0) taps.push([k, w / step]);
    }
    out.push(taps);
  }
  return out;
}

/** 28x28 Float32Array in [0, 1] from the drawing, or null if nothing is drawn. */
function preprocess(canvas) {
  const W = canvas.width, H = canvas.height;
  const rgba = canvas.getContext("2d", { willReadFrequently: true }).getImageData(0, 0, W, H).data;
  const ink = new Float32Array(W * H);
  let x0 = W, y0 = H, x1 = -1, y1 = -1;
  for (let y = 0; y < H; y++) {
    for (let x = 0; x < W; x++) {
      const v = rgba[(y * W + x) * 4] / 255;   // white on black: the red channel is the ink
      ink[y * W + x] = v;
      if (v > 0.05) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (x1 < 0) return null;
  const bw = x1 - x0 + 1, bh = y1 - y0 + 1;
  lastInkSide = Math.max(bw, bh) * 280 / Math.max(W, H);   // in 280-px pad units
  const scale = BOX / Math.max(bw, bh);
  const tw = Math.max(1, Math.round(bw * scale)), th = Math.max(1, Math.round(bh * scale));
  // Separable area averaging: columns first (bw -> tw), then rows (bh -> th).
  const wx = resampleWeights(bw, tw), wy = resampleWeights(bh, th);
  const tmp = new Float32Array(bh * tw);
  for (let y = 0; y < bh; y++) {
    const row = (y0 + y) * W + x0;
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [k, w] of wx[j]) s += ink[row + k] * w;
      tmp[y * tw + j] = s;
    }
  }
  const small = new Float32Array(th * tw);
  let mass = 0, mx = 0, my = 0;
  for (let i = 0; i < th; i++) {
    for (let j = 0; j < tw; j++) {
      let s = 0;
      for (const [k, w] of wy[i]) s += tmp[k * tw + j] * w;
      s = Math.min(1, s);
      small[i * tw + j] = s;
      mass += s; mx += s * j; my += s * i;
    }
  }
  // Integer shift that puts the centre of mass at (14, 14), kept inside the 28x28 frame.
  const clamp = (v, lo, hi) => Math.max(lo, Math.min(hi, v));
  const ox = clamp(Math.round(CENTRE - mx / mass), 0, SIDE - tw);
  const oy = clamp(Math.round(CENTRE - my / mass), 0, SIDE - th);
  const out = new Float32Array(SIDE * SIDE);
  for (let i = 0; i < th; i++) {
    for (let j = 0; j < tw; j++) out[(oy + i) * SIDE + ox + j] = small[i * tw + j];
  }
  return out;
}

function showInput(pixels) {
  const img = inputCtx.createImageData(SIDE, SIDE);
  for (let i = 0; i < SIDE * SIDE; i++) {
    const v = Math.round((pixels ? pixels[i] : 0) * 255);
    img.data.set([v, v, v, 255], i * 4);
  }
  inputCtx.putImageData(img, 0, 0);
}

// ---- drawing ----------------------------------------------------------------------------

function clearPad() {
  padCtx.fillStyle = "#000";
  padCtx.fillRect(0, 0, pad.width, pad.height);
}

function setupDrawing() {
  clearPad();
  let last = null;
  const at = (e) => {
    const r = pad.getBoundingClientRect();
    return [(e.clientX - r.left) * pad.width / r.width, (e.clientY - r.top) * pad.height / r.height];
  };
  const dot = ([x, y]) => {
    padCtx.beginPath();
    padCtx.arc(x, y, BRUSH / 2, 0, 2 * Math.PI);
    padCtx.fill();
  };
  pad.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    pad.setPointerCapture(e.pointerId);
    padCtx.fillStyle = "#fff";
    last = at(e);
    dot(last);
  });
  pad.addEventListener("pointermove", (e) => {
    if (!last) return;
    const p = at(e);
    padCtx.strokeStyle = "#fff";
    padCtx.lineWidth = BRUSH;
    padCtx.lineCap = "round";
    padCtx.beginPath();
    padCtx.moveTo(last[0], last[1]);
    padCtx.lineTo(p[0], p[1]);
    padCtx.stroke();
    last = p;
  });
  const end = () => {
    if (!last) return;
    last = null;
    requestPredict();
  };
  pad.addEventListener("pointerup", end);
  pad.addEventListener("pointercancel", end);
  $("clear").addEventListener("click", () => {
    clearPad();
    showInput(null);
    showResult(null);
  });
}

/** A 28x28 canvas showing a uint8 MNIST image. */
function imageCanvas(bytes) {
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = SIDE;
  const c = canvas.getContext("2d");
  const img = c.createImageData(SIDE, SIDE);
  for (let i = 0; i < SIDE * SIDE; i++) img.data.set([bytes[i], bytes[i], bytes[i], 255], i * 4);
  c.putImageData(img, 0, 0);
  return canvas;
}

/** Draw a 28x28 uint8 MNIST image onto the pad (scaled up) and predict it. */
function drawSample(bytes) {
  clearPad();
  padCtx.imageSmoothingEnabled = true;
  padCtx.drawImage(imageCanvas(bytes), 0, 0, pad.width, pad.height);
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
    ? `Weights: ${kb} KB, trained with ${meta.trainer || "PyTorch"} (${meta.epochs || "?"} epochs, ` +
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
