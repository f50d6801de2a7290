// The OCR page: loading (ember's Worker, the three ONNX models), decoding the user's image in
// the browser, drawing the boxes, and the bridge to app.py, which runs in the worker (Pyodide
// never runs on this thread).
//
// JS API (for tests and for pages that embed the demo):
//   window.emberDemo.ready                       Promise, resolves (to .info) when the models
//                                                answer on the CPU; WebGPU starts after that
//   window.emberDemo.webgpuReady                 Promise -> {ok, error, ms} once WebGPU is warm
//                                                (the page then switches to it) or has failed
//   await window.emberDemo.read(imageBytes, backend)
//        imageBytes: a Uint8Array of PNG / JPEG (any format the browser decodes) bytes
//        backend: "webgpu" | "cpu" (default: the one selected on the page; "cpu" is ember's
//        WebAssembly SIMD backend) | "python" (pure Python, for comparison: very slow)
//        -> an Array, the same list as `python demos/ocr/ocr.py IMAGE --json` prints:
//           [{text, score, box: [[x, y] x4]}] in reading order (clockwise corners from the
//           top left, in the image's pixels); JSON.stringify gives exactly that list. The
//           array also carries (as properties, not elements): timings {decode, preprocess,
//           detect, boxes, crop, classify, recognise, total, roundTrip} in ms, backend,
//           device ("wasm" | "webgpu" | "python"), width, height.
//   await window.emberDemo.readDetailed(imageBytes, backend)
//        -> {lines (the list above), timings, backend, device, width, height}
//   await window.emberDemo.show(imageBytes)      same as uploading the file; -> lastResult
//   window.emberDemo.setBackend(name)            same as clicking the radio button
//   window.emberDemo.highlight(i)                same as clicking line i (-1: none)
//   window.emberDemo.lastResult                  the readDetailed result shown on the page
//   window.emberDemo.info                        {webgpu, webgpuError, webgpuReadyMs, devices,
//                                                steps, readyMs, loadMs, modelBytes, ...}
//   window.emberDemo.worker                      the EmberWorker (see /wasm/ember.js)

import { loadEmber } from "../../wasm/ember.js";
import { $, progressBar, showError, clearError, inputError, loadFailed, Backends, pageReady, startApp,
         serially, decodeImage as decodeImageBytes } from "../../wasm/demo-kit.js";

const PY_DIR = "/home/pyodide/ocr";
const MODELS = ["ch_PP-OCRv4_det_infer.onnx", "ch_ppocr_mobile_v2.0_cls_infer.onnx", "ch_PP-OCRv4_rec_infer.onnx"];
const PY_FILES = ["images.py", "geometry.py", "pipeline.py", "app.py"];
const SAMPLES = ["receipt.png", "chinese.png", "tilted.png"];
const MAX_PIXELS = 40e6;
const MAX_BYTES = 50e6;
const STAGES = ["decode", "preprocess", "detect", "boxes", "crop", "classify", "recognise", "total"];

let worker = null;
let backends = null;
let shownUrl = null;

// ---- decoding (in the browser) ------------------------------------------------------------

/** {width, height, rgba: Uint8Array} of encoded image bytes; an InputError if they are not an
 *  image the browser can decode. */
async function decodeImage(bytes) {
  if (!(bytes instanceof Uint8Array)) throw inputError("read: give the image's bytes as a Uint8Array");
  return decodeImageBytes(bytes, { maxBytes: MAX_BYTES, maxPixels: MAX_PIXELS });
}

// ---- the models ---------------------------------------------------------------------------

/** Read the text in `bytes` through app.py in the worker; calls are queued (one at a time). */
function readDetailed(bytes, which = backends ? backends.current : "cpu") {
  if (!backends) return Promise.reject(inputError("the models are not loaded yet: await emberDemo.ready"));
  const bad = backends.check(which);
  if (bad) return Promise.reject(inputError(bad));
  return serially(async () => {
    const t0 = performance.now();
    const img = await decodeImage(bytes);
    const decodeMs = performance.now() - t0;
    const r = await worker.call("app", "read", [img.width, img.height, img.rgba, which], { transfer: [img.rgba.buffer] });
    const timings = { ...r.timings, decode: decodeMs, roundTrip: performance.now() - t0 };
    return { lines: r.lines, timings, backend: r.backend, device: r.device, width: r.width, height: r.height };
  });
}

async function read(bytes, which) {
  const r = await readDetailed(bytes, which);
  const out = r.lines.map((l) => ({ text: l.text, score: l.score, box: l.box }));
  return Object.assign(out, { timings: r.timings, backend: r.backend, device: r.device, width: r.width, height: r.height });
}

// ---- the page -----------------------------------------------------------------------------

function svgEl(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  return el;
}

function highlight(i) {
  document.querySelectorAll("#overlay polygon").forEach((p, k) => p.classList.toggle("on", k === i));
  document.querySelectorAll("#lines li").forEach((li, k) => li.classList.toggle("on", k === i));
}

function showResult(r) {
  window.emberDemo.lastResult = r;
  const svg = $("overlay");
  svg.replaceChildren();
  svg.setAttribute("viewBox", `0 0 ${r.width} ${r.height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const ol = $("lines");
  ol.replaceChildren();
  r.lines.forEach((l, i) => {
    const poly = svgEl("polygon", { points: l.box.map(([x, y]) => `${x},${y}`).join(" ") });
    const title = svgEl("title", {});
    title.textContent = l.text;
    poly.append(title);
    svg.append(poly);
    const num = svgEl("text", { x: l.box[0][0], y: Math.max(10, l.box[0][1] - 2) });
    num.textContent = String(i + 1);
    svg.append(num);
    const li = document.createElement("li");
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = l.text;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = `${(100 * l.score).toFixed(0)}%`;
    li.append(text, score);
    li.addEventListener("click", () => highlight(li.classList.contains("on") ? -1 : i));
    ol.append(li);
  });
  $("no-text").hidden = r.lines.length > 0;
  const tb = $("timings").querySelector("tbody");
  tb.replaceChildren();
  for (const s of STAGES) {
    if (r.timings[s] == null) continue;
    const tr = document.createElement("tr");
    tr.className = s;
    tr.innerHTML = `<td>${s}</td><td>${r.timings[s].toFixed(0)}</td>`;
    tb.append(tr);
  }
  $("backend-name").textContent = backends.label(r.backend);
}

function showPicture(bytes) {
  if (shownUrl) URL.revokeObjectURL(shownUrl);
  shownUrl = URL.createObjectURL(new Blob([bytes]));
  $("picture").src = shownUrl;
  $("placeholder").hidden = true;
  $("overlay").replaceChildren();
  $("lines").replaceChildren();
  $("no-text").hidden = true;
}

let lastBytes = null;

async function show(bytes) {
  lastBytes = bytes;
  showPicture(bytes);
  clearError();
  $("busy").hidden = false;
  $("busy").textContent = `reading on the ${backends.label(backends.current)}…`;
  try {
    const r = await readDetailed(bytes, backends.current);
    showResult(r);
    return r;
  } finally {
    $("busy").hidden = true;
  }
}

function showAndReport(bytes) {
  return show(bytes).catch(showError);
}

function setBackend(name) {
  if (!backends) throw inputError("the models are not loaded yet: await emberDemo.ready");
  backends.select(name);
}

async function setupSamples() {
  const box = $("samples");
  for (const name of SAMPLES) {
    const btn = document.createElement("button");
    btn.type = "button";
    btn.title = `sample: ${name}`;
    btn.dataset.sample = name;
    const img = document.createElement("img");
    img.src = `samples/${name}`;
    img.alt = name;
    btn.append(img);
    btn.addEventListener("click", async () => {
      const bytes = new Uint8Array(await (await fetch(`samples/${name}`)).arrayBuffer());
      showAndReport(bytes);
    });
    box.append(btn);
  }
  $("file").addEventListener("change", async (e) => {
    const f = e.target.files[0];
    if (f) showAndReport(new Uint8Array(await f.arrayBuffer()));
  });
  const stage = $("stage");
  stage.addEventListener("dragover", (e) => e.preventDefault());
  stage.addEventListener("drop", async (e) => {
    e.preventDefault();
    const f = e.dataTransfer.files[0];
    if (f) showAndReport(new Uint8Array(await f.arrayBuffer()));
  });
}

// ---- loading ------------------------------------------------------------------------------

async function main() {
  const t0 = performance.now();
  const MB = 1e6;
  const bar = progressBar(0.5, 0.4);
  setupSamples();
  const modelUrls = MODELS.map((m) => new URL(m, location.href).href);
  const configUrl = new URL("config.yaml", location.href).href;
  const progress = new Map();   // url -> {loaded, total}
  const onDownload = (p) => {
    if (!modelUrls.includes(p.url)) return;
    progress.set(p.url, p);
    let loaded = 0, total = 0, cached = true;
    for (const q of progress.values()) { loaded += q.loaded || 0; total += q.total || 0; cached = cached && q.cached; }
    const frac = progress.size === MODELS.length && total ? loaded / total : 0.9 * (loaded / (total || 16.2e6));
    bar.weights(Math.min(1, frac), cached && progress.size === MODELS.length ? "models (cached)"
      : `models ${(loaded / MB).toFixed(1)} / ${total && progress.size === MODELS.length ? (total / MB).toFixed(1) : "16.2"} MB`);
  };
  worker = await loadEmber({ worker: true, onProgress: bar.boot, prefetch: [...modelUrls, configUrl, ...PY_FILES], onDownload });
  const info = { ...worker.info, webgpu: false, webgpuError: null };
  window.emberDemo.info = info;
  window.emberDemo.worker = worker;
  const steps = { emberReady: performance.now() - t0 };

  bar(0.02, "Loading the models");
  const [devices, ...files] = await Promise.all([
    startApp(worker, PY_DIR, PY_FILES),
    ...modelUrls.map((u, i) => worker.fetchFile(u, `${PY_DIR}/${MODELS[i]}`)),
    worker.fetchFile(configUrl, `${PY_DIR}/config.yaml`),
  ]);
  steps.modelsFetched = performance.now() - t0;
  const loaded = await worker.call("app", "load", [PY_DIR, ["cpu"]]);
  info.loadMs = loaded.load_ms;
  info.devices = loaded.devices;
  info.modelBytes = loaded.bytes;
  info.modelsCached = files.slice(0, MODELS.length).every((f) => f.cached);
  steps.modelsLoaded = performance.now() - t0;

  backends = new Backends({ devices, info, demo: "OCR", onChange: () => { if (lastBytes && !window.emberDemo.busyExternally) showAndReport(lastBytes); } });
  $("python-choice").hidden = true;    // the detector takes minutes in pure Python
  bar(0.1, "Ready");
  pageReady();
  info.readyMs = performance.now() - t0;
  info.steps = steps;
  const total = Object.values(loaded.bytes).reduce((a, b) => a + b, 0);
  $("model-info").textContent =
    `Models: ${(total / MB).toFixed(1)} MB of ONNX${info.modelsCached ? " (from the browser's cache)" : ""}, ` +
    `${loaded.characters} characters in the dictionary; ready in ${(info.readyMs / 1000).toFixed(1)} s.`;

  // WebGPU in the background; on a software adapter (SwiftShader...) the page stays on the CPU,
  // which is faster there, and offers WebGPU under Backend.
  backends.startWebGPU(worker, async () => {
    const w = await worker.call("app", "start_webgpu");
    if (w.fallback_adapter) backends.picked = true;
    return w;
  }, t0).then(webgpuDone);
  return info;
}

let webgpuDone;
window.emberDemo = {
  read,
  readDetailed,
  show,
  setBackend,
  highlight,
  lastResult: null,
  info: null,
  worker: null,
  webgpuReady: new Promise((resolve) => { webgpuDone = resolve; }),
};
window.emberDemo.ready = main().catch((e) => {
  webgpuDone({ ok: false, error: `the page did not load: ${e.message || e}`, ms: 0 });
  return loadFailed(e);
});
